"""Every disk type (see ``conftest.DISK_KINDS``) passes the conformance suite."""

from .conformance import DiskConformance


class TestDisks(DiskConformance):
    pass
