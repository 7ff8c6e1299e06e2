"""The public path of AIToolbox's experiment savers that upload too (S3, Google Cloud Storage), defined with the local
ones in :mod:`aitoolbox_like.experiment.savers`."""
from .savers import (BaseFullExperimentGoogleStorageSaver, BaseFullExperimentS3Saver,  # noqa: F401  (public path)
                     FullPyTorchExperimentGoogleStorageSaver, FullPyTorchExperimentS3Saver)
