"""A saved copy of the one segment being rewritten in place, for journals and the WAL.

SQLite appends to its rollback journal and WAL in pieces that do not line up
with segments, so the segment at the end of the file is read, extended and
written again, and it still holds bytes of earlier, committed records. A
``pwrite`` is not atomic: a process killed between two kernel pages of a
record (SIGKILL is checked there), or a power cut, leaves the record half old,
half new, and it no longer authenticates, taking committed bytes with it.

So before such a rewrite the store puts the segment's current record, still
encrypted, in ``<file>-cdtail``: ``index u64le || length u64le || record``
(both VFSes write it with one ``pwritev`` at offset 0, never through a
memory mapping, which a cut file would end with SIGBUS; only the length in it
counts, the file may be longer).
When a segment of that file later fails authentication and the side file
holds an authentic record for the same index, the store uses it: the file is
then as it was before the interrupted write, exactly what SQLite expects after
a crash. The saved record is ciphertext under the file's own key and binds the
file id and index, so it cannot be moved elsewhere; what it can give an
attacker is the previous version of the last segment, which is no more than
cutting the file short (already undetectable without a trusted size).

Power loss is worse than a killed process: the kernel may write a rewrite back
half done at any time, not only while ``pwrite`` runs, and the record holds
bytes of commits SQLite reported durable (or frames a checkpoint copied, which
recovery would otherwise read again over newer pages). So the copy is synced
before the rewrite is issued (the directory too, the first time), and the store
syncs the file before a copy whose rewrite SQLite has not synced yet is replaced
(see :class:`cryptdisk.format.MutableStore`).
"""

from __future__ import annotations

from ..format import TAIL_SUFFIX as SUFFIX
from ..format import TailSave, remove_tail

__all__ = ["SUFFIX", "TailSave", "remove_tail"]
