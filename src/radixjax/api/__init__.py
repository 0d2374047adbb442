"""What the HTTP server (server/) and the frontend language (lang/) share, below both
(above the engine): SGLang's native /generate request and response (native.py), the
error a bad request gets (errors.py), chat roles read off a model's template
(chat_roles.py)."""
