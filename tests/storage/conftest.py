import os
import sys

# tests/ has no __init__.py, so pytest puts only this folder on sys.path for our modules.
_TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from s3_server import s3_server  # noqa: E402,F401  (pytest fixture)
from cloud_servers import azure_server, cloud, gcs_server  # noqa: E402,F401  (pytest fixtures)
