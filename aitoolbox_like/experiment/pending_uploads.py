"""The uploads of an experiment folder that no storage has confirmed yet: the journal that lists them, and
:func:`sync_experiment`, which uploads them later (what ``python -m aitoolbox_like.experiment.sync`` runs)."""
import os
from typing import Optional

from ..storage.journal import SyncReport, UploadJournal, sync_journal
from .layout import PENDING_UPLOADS, absolute_folder, bookkeeping_dir


def experiment_journal(folder) -> UploadJournal:
    """The upload journal of the experiment folder ``folder``, in its bookkeeping folder."""
    folder = absolute_folder(folder)
    return UploadJournal(os.path.join(bookkeeping_dir(folder), PENDING_UPLOADS), base_dir=folder)


def sync_experiment(folder, endpoint_url: Optional[str] = None) -> SyncReport:
    """Upload the files the experiment folder's journal of pending uploads lists (uploads a run queued but could
    not confirm: the cloud was down when it ended, or it was killed), to the cloud / bucket / prefix / key each entry
    records.

    ``endpoint_url`` replaces the recorded endpoint. Uploads that fail stay listed (run it again later); the
    command line ``python -m aitoolbox_like.experiment.sync FOLDER`` does the same. Do not run it while a run is
    still training into the folder (that run uploads its own files; both would upload them).
    """
    report = sync_journal(experiment_journal(folder), endpoint_url=endpoint_url)
    report.folder = absolute_folder(folder)
    return report
