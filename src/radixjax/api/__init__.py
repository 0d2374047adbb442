"""What the HTTP server (server/) and the frontend language (lang/) share, below both:
chat roles read off a model's template (chat_roles.py)."""
