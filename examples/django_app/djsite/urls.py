from accounts import views
from django.urls import path

urlpatterns = [
    path("signup", views.signup),
    path("users/<int:user_id>", views.user),
]
