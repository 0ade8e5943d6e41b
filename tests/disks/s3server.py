"""A real S3-compatible HTTP server on 127.0.0.1 (moto in server mode) for the tests.

Credentials are dummies set in the environment, as a real deployment would
(never in storage_options).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextmanager
def s3_server() -> Iterator[str]:
    """Start moto's S3 server on a free loopback port; yields its endpoint URL."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no request log on stderr
    old = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def make_bucket(endpoint: str, bucket: str) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True)
    fs.mkdir(bucket)
