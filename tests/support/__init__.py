"""What the tests share, one module a concern (imported as `support.<module>`; pyproject puts
tests/ on the path):

- processes: start a child, poll until it serves, stop it (the one wait_until and stop_all)
- services: PostgreSQL templates, Redis, RabbitMQ, and how a missing one is reported
- platforms: users made as the CLI makes them and signed in through the API
- datasets: workspaces and uploads through the API, and what a refused upload leaves
- jobs: a job request and its submission through the API
- servers: the control plane served (uvicorn in a thread, `nebula up`, `nebula serve`)
- clusters: a whole platform with switches and workers, or clusters registered in the database
- certs: a throwaway PKI made with `cryptography` and the contract, no control plane
- switches: switch pairs on loopback, a link-cutting proxy, a log waiter (and their fixtures)
- identity: a real OpenID provider (glewlwyd)
- browser: a `nebula up` site driven by Chromium
- hf: small random `transformers` models saved as Hugging Face folders
- disks: a small tmpfs that fills up

Nothing is imported here, so that `support.switches` and `support.certs` load nothing of `app`.
"""
