"""The admission webhooks: a Flask app (``webhook.app.create_app``) served by gunicorn over TLS."""
