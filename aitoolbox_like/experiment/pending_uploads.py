"""The uploads of an experiment folder that no storage has confirmed yet: the journals that list them (ours, and
the one earlier versions kept at the folder's root), and :func:`sync_experiment`, which uploads them later (what
``python -m aitoolbox_like.experiment.sync`` runs)."""
import os
from typing import List, Optional

from ..storage.journal import SyncReport, UploadJournal, sync_journal
from .layout import PENDING_UPLOADS, absolute_folder, bookkeeping_dir


def experiment_journals(folder) -> List[UploadJournal]:
    """The upload journals of the experiment folder ``folder``: the one in its bookkeeping folder, and the one at
    its root that versions before the bookkeeping folder wrote (when present)."""
    folder = absolute_folder(folder)
    journals = [UploadJournal(os.path.join(bookkeeping_dir(folder), PENDING_UPLOADS), base_dir=folder)]
    legacy = os.path.join(folder, PENDING_UPLOADS)
    if os.path.isfile(legacy):
        journals.append(UploadJournal(legacy))
    return journals


def sync_experiment(folder, endpoint_url: Optional[str] = None) -> SyncReport:
    """Upload the files the experiment folder's journal of pending uploads lists (uploads a run queued but could
    not confirm: the cloud was down when it ended, or it was killed), to the cloud / bucket / prefix / key each entry
    records.

    ``endpoint_url`` replaces the recorded endpoint. Uploads that fail stay listed (run it again later); the
    command line ``python -m aitoolbox_like.experiment.sync FOLDER`` does the same. Do not run it while a run is
    still training into the folder (that run uploads its own files; both would upload them).
    """
    report = SyncReport(absolute_folder(folder))
    for journal in experiment_journals(folder):
        part = sync_journal(journal, endpoint_url=endpoint_url)
        report.uploaded += part.uploaded
        report.failed += part.failed
        report.missing += part.missing
    return report
