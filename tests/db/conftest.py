import pytest

import cryptdisk


@pytest.fixture
def db(tmp_path):
    d = cryptdisk.connect(tmp_path / "db")
    yield d
    d.close()
