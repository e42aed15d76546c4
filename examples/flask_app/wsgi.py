from shop import create_app, tidings

app = create_app()
tidings_app = tidings.app  # notify-worker -A wsgi:tidings_app
