import os
import sys

# tests/saving (saving_helpers) on sys.path; tests/support is there already (tests/conftest.py).
_SAVING = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'saving')
if _SAVING not in sys.path:
    sys.path.insert(0, _SAVING)

from s3_server import s3_server  # noqa: E402,F401  (pytest fixture)
from cloud_servers import azure_server, cloud, gcs_server  # noqa: E402,F401  (pytest fixtures)
