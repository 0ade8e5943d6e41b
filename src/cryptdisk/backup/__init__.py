"""Encrypted, verifiable, incremental backups of cryptdisk databases on any fsspec target.

::

    from cryptdisk.backup import Repository, create, restore, verify

    repo = Repository.init("backups/", passphrase="correct horse")
    summary = create(repo, "analytics.db")          # the database's own keys read it
    restore(repo, summary.id, "analytics-restored.db")

Chunks are cut by content (FastCDC), deduplicated across every backup of the
repository, compressed (zstd) and encrypted (AES-256-GCM) under the repository's
own key; manifests are encrypted, authenticated and chained. ``docs/backup.md``
describes the format and its guarantees.
"""

from ._ops import (
    BackupSummary,
    VerifyReport,
    create,
    find_backup,
    list_backups,
    prune,
    restore,
    retained,
    verify,
)
from ._repo import ChunkProblem, Repository

__all__ = ["BackupSummary", "ChunkProblem", "Repository", "VerifyReport", "create",
           "find_backup", "list_backups", "prune", "restore", "retained", "verify"]
