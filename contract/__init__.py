"""What the control plane and the clusters share, and nothing else.

Plain data and pure functions: no torch, no database, no sockets, nothing of the project.
Both sides import it; neither imports the other through it.

- `jobtoken`: the job token's claims, signed by the control plane, verified by a switch;
- `kinds`: the job kinds table (roles, peers, inputs, artifacts, config models);
- `presets`: the named sizes of each kind's training config;
- `codec_spec`: the codec spec grammar (parsing and validation; the codecs are built on the
  cluster, by workers.compression);
- `queues`: the broker's queue and task names;
- `cluster_api`: the bodies and answers of the cluster API;
- `fields`: the strict base of every request body.
"""

API_PREFIX = "/api/v1"  # every route of the control plane's HTTP API lies under it
