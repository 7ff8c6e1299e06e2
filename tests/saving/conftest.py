import os
import sys

# This folder (saving_helpers, the scripts' common parts) on sys.path; tests/support is there already
# (tests/conftest.py).
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from s3_server import s3_server  # noqa: E402,F401  (pytest fixture)
from cloud_servers import azure_server, cloud, gcs_server  # noqa: E402,F401  (pytest fixtures)
