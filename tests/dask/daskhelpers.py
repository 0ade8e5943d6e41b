"""Helpers shared by the Dask tests (a unique module name, unlike ``conftest``)."""

import base64
import pickle

import cloudpickle
from distributed.diagnostics.plugin import SchedulerPlugin

from ..db.dbhelpers import write_config


def write_s3_config(tmp_path, endpoint, bucket, prefix):
    """write_config's disks and keys, with the encrypted disk ``secure`` over S3.

    The S3 disk's storage_options hold only the endpoint; credentials come from
    the environment.
    """
    cfg = write_config(tmp_path, [1], 1, name="s3.toml")
    text = cfg.read_text().replace(
        '[disks.secure_local]\ntype = "local"\npath = "store/secure"\n',
        f'[disks.secure_local]\ntype = "fsspec"\nurl = "s3://{bucket}/{prefix}"\n'
        f'storage_options = {{ endpoint_url = "{endpoint}" }}\n')
    assert "s3://" in text
    cfg.write_text(text)
    return cfg


class TaskRecorder(SchedulerPlugin):
    """On the scheduler: every task sent to a worker, as pickle, cloudpickle and repr.

    What the scheduler holds for a task (``run_spec``) is what it ships to the worker
    and what its dashboard pages describe.
    """

    name = "cryptdisk-task-recorder"

    def __init__(self):
        self.blobs = []
        self.scheduler = None

    def start(self, scheduler):
        self.scheduler = scheduler

    def transition(self, key, start, finish, *args, stimulus_id, **kwargs):
        if finish != "processing":
            return
        spec = self.scheduler.tasks[key].run_spec
        blobs = [cloudpickle.dumps(spec), repr(spec).encode(), repr(key).encode()]
        try:
            blobs.append(pickle.dumps(spec))
        except Exception:  # some specs hold lambdas: cloudpickle has them
            pass
        self.blobs.append((key, blobs))


def recorded_tasks(client):
    """The (key, blobs) TaskRecorder collected so far, and clears them."""
    def take(dask_scheduler):
        plugin = dask_scheduler.plugins[TaskRecorder.name]
        blobs, plugin.blobs = plugin.blobs, []
        return blobs
    return client.run_on_scheduler(take)


def encodings(raw):
    """``raw`` key bytes as a leak would show them: raw, hex (lower, upper), base64 (standard
    and URL-safe, with and without padding)."""
    b64 = [base64.b64encode(raw), base64.urlsafe_b64encode(raw)]
    return [raw, raw.hex().encode(), raw.hex().upper().encode(), *b64,
            *(b.rstrip(b"=") for b in b64)]


def key_needles(tmp_path, *secrets):
    """The bytes of key file k1.hex (see :func:`encodings`) and ``secrets`` as bytes."""
    key_hex = (tmp_path / "k1.hex").read_text().split()[-1]
    return [*encodings(bytes.fromhex(key_hex)), *(s.encode() for s in secrets)]
