from django.urls import path

from accounts import views

urlpatterns = [
    path("signup", views.signup),
    path("users/<int:user_id>", views.user),
]
