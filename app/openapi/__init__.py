"""The OpenAPI document: marks.py (what routes declare), document.py (the builder), offline.py
(the document built without a server; `python -m app.openapi` prints it)."""
