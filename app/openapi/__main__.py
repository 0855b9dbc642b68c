"""`python -m app.openapi > openapi.json`: the input of client generators (make api-types)."""

from __future__ import annotations

import json
import sys

from app.openapi.offline import offline_document

json.dump(offline_document(), sys.stdout, indent=2, sort_keys=True)
sys.stdout.write("\n")
