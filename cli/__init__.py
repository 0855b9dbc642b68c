"""The `nebula` command: the composition root that starts every part of the platform.

It may import every side: the control plane (app/), the cluster side (workers/) and the
contract between them. Nothing imports it back. `cli.main` parses the command line and
hands each subcommand to its side: `cli.control_plane` (serve, users, clusters, db,
audit, up, demo ...) or `cli.cluster` (switch, worker). `cli.up` runs the whole
platform on one machine; `cli.demo` tells the story through the REST API.
"""
