"""Run PyKMIP's server on loopback with mutual TLS (a child process of the KMIP tests).

argv: DIR PORT. DIR holds ca.pem, server.pem, server.key; the server keeps its
SQLite database and log there. Prints "listening" once the socket is bound.
"""

import logging
import sys
import warnings

warnings.simplefilter("ignore")

from kmip.services.server import KmipServer  # noqa: E402

root, port = sys.argv[1], int(sys.argv[2])
server = KmipServer(hostname="127.0.0.1", port=port, certificate_path=f"{root}/server.pem",
                    key_path=f"{root}/server.key", ca_path=f"{root}/ca.pem",
                    auth_suite="TLS1.2", config_path=None, log_path=f"{root}/server.log",
                    policy_path=None, enable_tls_client_auth=True,
                    logging_level=logging.INFO, database_path=f"{root}/kmip.sqlite")
with server:
    print("listening", flush=True)
    server.serve()
