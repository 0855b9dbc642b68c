"""The cluster API: the only door through which a job's roles reach the control plane.

A role authenticates every call twice: with its cluster's worker credential (which an
admin can revoke) and with its job token (Ed25519, bound to job, attempt, role and
cluster, minutes long, renewed by the heartbeat). It claims its attempt, beats, posts
metric batches, reads its inputs (grant checked and audited at that moment, decrypted
here, streamed), uploads its outputs (encrypted here into the job owner's workspace)
and finishes. A cluster never holds the database, the platform secret or a data key.
"""
