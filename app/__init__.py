"""Nebula's control plane: accounts, workspaces, grants, jobs, clusters, PKI and audit.

Who commits
-----------
A request, a cluster-API call, a reaper pass and a CLI command are each one unit of work,
and its owner commits it, once, when the work is done: the route (`routes.py`), the
reaper (`jobs/dispatch.py`), the command. Services never commit. They add, change and
flush, and they append the audit event of a change in the same transaction as the
change, so that the two are kept or lost together; a unit that raises is rolled back
whole when its session closes.

What must follow a commit (stopping the jobs of a grant that ended, dispatching a job's
roles, removing a deleted dataset's file) the service returns or names, and the owner
calls it after its commit, as a unit of its own. No listener or hook list does it behind
the owner's back.

A service ends a transaction itself at three moments only, each through a helper of
`app.unit_of_work` that names it, never with a bare `commit()`:

- `commit_before_raising`: a record that must outlive the error raised next (an audited
  denial, a failed login or lockout, a refused enrollment, a job failed because its
  input's grant ended);
- `commit_before_waiting`: nothing is held through a slow wait (a body streaming in,
  argon2, an export's next batch);
- `commit_with_file`: a stored file's row commits with the file moved in place for it,
  and the file goes if the commit fails.

`tests/app/test_unit_of_work.py` fails on a commit anywhere else.
"""
