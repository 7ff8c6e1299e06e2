"""``python -m aitoolbox_like.experiment.sync FOLDER``: upload what an experiment folder's journal lists.

A run records every upload in ``pending_uploads.json`` in the experiment's bookkeeping folder
(``<results folder>/.aitoolbox_like/<project>/<experiment folder name>/``) until the storage confirmed it. When the
cloud was down at the end of fit (longer than ``ExperimentUploader.wait_timeout_s``) or the process was killed, the
files stay listed there; this command uploads them to the cloud (S3, Google Cloud Storage, Azure), bucket, prefix,
endpoint and key each entry records, then removes them from the journal (and deletes the local files a run asked to
delete after their upload).

Exit status: 0 when nothing is left to upload, 1 when some uploads failed (they stay listed; run it again), 2 on
a wrong argument.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

from ..storage.journal import JOURNAL_NAME, SyncReport
from .pending_uploads import sync_experiment


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sync command with ``argv`` (default: ``sys.argv[1:]``); returns the exit status."""
    parser = argparse.ArgumentParser(
        prog='python -m aitoolbox_like.experiment.sync',
        description=f'Upload the files the {JOURNAL_NAME} of an experiment folder lists (uploads a run could not '
                    f'finish), to the cloud bucket/prefix/key recorded for each.')
    parser.add_argument('folders', nargs='+', metavar='FOLDER', help='experiment folder(s)')
    parser.add_argument('--endpoint-url', default=None,
                        help='the endpoint to use instead of the one recorded in the journal (an S3 endpoint, a '
                             'Google Cloud Storage API endpoint, an Azure account URL)')
    parser.add_argument('-v', '--verbose', action='store_true', help='log each upload')
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format='%(levelname)s %(name)s: %(message)s')
    status = 0
    for folder in args.folders:
        if not os.path.isdir(folder):
            print(f'{folder}: not a folder', file=sys.stderr)
            status = max(status, 2)
            continue
        report = sync_experiment(folder, endpoint_url=args.endpoint_url)
        _print_report(report)
        if not report.complete:
            status = max(status, 1)
    return status


def _print_report(report: SyncReport) -> None:
    if not (report.uploaded or report.failed or report.missing):
        print(f'{report.folder}: nothing to upload')
        return
    for uri in report.uploaded:
        print(f'uploaded  {uri}')
    for path in report.missing:
        print(f'missing   {path} (no longer exists; dropped from the journal)')
    for path, error in report.failed:
        print(f'FAILED    {path}: {error}')
    print(f'{report.folder}: {len(report.uploaded)} uploaded, {len(report.failed)} failed'
          + ('; the failed ones stay listed, run this again later' if report.failed else ''))


if __name__ == '__main__':
    sys.exit(main())
