from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from accounts.events import UserRegistered
from accounts.models import User
from tidings import event


@csrf_exempt
@require_POST
def signup(request: HttpRequest) -> JsonResponse:
    """Create a user and fire UserRegistered inside one transaction.

    The queued listener is pushed when the transaction commits (``after_commit``); with
    ``rollback=1`` the transaction rolls back and nothing is queued.
    """
    email = request.POST["email"]
    with transaction.atomic():
        user = User.objects.create(email=email, name=request.POST.get("name", "friend"))
        event(UserRegistered(user))
        if request.POST.get("rollback"):
            transaction.set_rollback(True)
            return JsonResponse({"rolled_back": True}, status=409)
    return JsonResponse({"id": user.pk}, status=201)


def user(request: HttpRequest, user_id: int) -> JsonResponse:
    found = User.objects.filter(pk=user_id).first()
    if found is None:
        return JsonResponse({"error": "not found"}, status=404)
    return JsonResponse({"id": found.pk, "email": found.email, "welcomed": found.welcomed})
