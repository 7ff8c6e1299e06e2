import os
import sys

# tests/ has no __init__.py: put tests/ (s3_server, helpers) and tests/saving (saving_helpers) on sys.path.
_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(_HERE), os.path.join(os.path.dirname(_HERE), 'saving')):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from s3_server import s3_server  # noqa: E402,F401  (pytest fixture)
from cloud_servers import azure_server, cloud, gcs_server  # noqa: E402,F401  (pytest fixtures)
