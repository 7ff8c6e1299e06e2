from s3_server import s3_server  # noqa: F401  (pytest fixture; tests/support is on sys.path, see tests/conftest.py)
from cloud_servers import azure_server, cloud, gcs_server  # noqa: F401  (pytest fixtures)
