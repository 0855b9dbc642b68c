"""What both sides run and neither owns: the broker's Celery app, files written privately.

The control plane, the clusters and the command import it; it imports nothing of them (the
contract at most). import-linter holds it to that (pyproject.toml).
"""
