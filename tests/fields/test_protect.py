"""Protected ingestion: rules, protect_file, cryptdisk protect, and a kill in the middle."""

import base64
import datetime
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import cryptdisk
from cryptdisk.errors import FieldError, KeyNotFoundError
from cryptdisk.fields import (
    FieldKeys,
    decrypt,
    decrypt_deterministic,
    fpe_decrypt,
    parse_rule,
    protect_file,
    protect_table,
)

CARDS = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
SRC = str(Path(cryptdisk.__file__).resolve().parents[1])


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "fields.toml"
    path.write_text(f'[fields.keys.cards]\nhex = "{CARDS}"\n')
    return path


@pytest.fixture
def keys(config):
    return FieldKeys.from_config(config)


def test_rules_parse_and_refuse_nonsense():
    rule = parse_rule("pan=tokenize:cards,keep_first=6,keep_last=4,luhn=true")
    assert (rule.column, rule.function, rule.key) == ("pan", "tokenize", "cards")
    assert rule.options == {"keep_first": 6, "keep_last": 4, "luhn": True}
    assert parse_rule("phone=mask_last4").key is None
    for bad, match in [("pan", "COLUMN="), ("pan=rot13:cards", "unknown function"),
                       ("pan=encrypt", "needs a field key"), ("p=mask_full:cards", "no key"),
                       ("p=tokenize:c,keep=1", "unknown option"),
                       ("p=tokenize:c,luhn=maybe", "true or false")]:
        with pytest.raises(FieldError, match=match):
            parse_rule(bad)


def test_protect_csv_to_parquet_keeps_text_and_other_columns(tmp_path, keys):
    src = tmp_path / "in.csv"
    src.write_text("id,pan,email\n1,0041111111111111,a@x.org\n2,5500005555555559,b@y.org\n")
    dst = tmp_path / "out.parquet"
    summary = protect_file(src, dst, [parse_rule("pan=fpe_encrypt:cards"),
                                      parse_rule("email=encrypt_deterministic:cards")], keys)
    assert summary.rows == 2
    out = pq.read_table(dst)
    assert out.column("id").to_pylist() == ["1", "2"]  # a CSV's text, as it is
    pans = out.column("pan")
    assert all(len(p) == 16 and p.isdigit() for p in pans.to_pylist())
    assert "0041111111111111" not in dst.read_bytes().decode("latin-1")
    assert fpe_decrypt(pans, keys["cards"], "pan").to_pylist() == ["0041111111111111",
                                                                   "5500005555555559"]
    assert decrypt_deterministic(out.column("email"), keys["cards"]).to_pylist() == [
        "a@x.org", "b@y.org"]


def test_protect_table_names_a_missing_column(keys):
    with pytest.raises(FieldError, match="no column 'pan'"):
        protect_table(pa.table({"x": ["1"]}), [parse_rule("pan=mask_full")], keys)


def test_the_output_is_synced_then_its_name_in_its_directory(tmp_path, keys, monkeypatch):
    """An output protect_file returned survives a power loss: the file is synced before its
    rename and its directory after it (a power loss cannot be staged here, so the fsyncs
    are recorded). Before, the directory was never synced: the rename could be lost and
    the old output (or none) come back with clear values."""
    src = tmp_path / "in.csv"
    src.write_text("id,pan\n1,0041111111111111\n")
    out = tmp_path / "out"
    out.mkdir()
    dst = out / "protected.parquet"
    dst.write_bytes(b"the old output")
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        target = os.readlink(f"/proc/self/fd/{fd}")
        synced.append((target, dst.read_bytes() != b"the old output"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    protect_file(src, dst, [parse_rule("pan=mask_full")], keys, replace=True)
    monkeypatch.undo()
    (temporary, renamed), directory = synced
    assert os.path.dirname(temporary) == str(out) and not renamed  # before its rename
    assert directory == (str(out), True)  # after it
    assert pq.read_table(dst).column("pan").to_pylist() == ["****************"]


def test_a_failure_leaves_the_old_output_and_no_temporary(tmp_path, keys):
    src = tmp_path / "in.csv"
    src.write_text("pan\n4111111111111111\n4111111111111112\n")
    dst = tmp_path / "out.csv"
    dst.write_text("old\n")
    with pytest.raises(FieldError, match="row 1 fails the Luhn check"):
        protect_file(src, dst, [parse_rule("pan=tokenize:cards,luhn=true")], keys,
                     replace=True)
    assert dst.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fields.toml", "in.csv", "out.csv"]
    with pytest.raises(KeyNotFoundError, match="no field key named 'other'"):
        protect_file(src, dst, [parse_rule("pan=encrypt:other")], keys, replace=True)
    with pytest.raises(FieldError, match="no such file"):
        protect_file(tmp_path / "missing.csv", dst, [parse_rule("pan=mask_full")], keys,
                     replace=True)


def test_an_existing_output_is_refused_unless_replace(tmp_path, keys):
    """An existing output, an encrypted database say, was replaced with no question: the
    file, a link to nothing and the input itself are refused, untouched; replace=True
    replaces a file once the output is whole."""
    src = tmp_path / "in.csv"
    src.write_text("pan\n4111111111111111\n")
    rules = [parse_rule("pan=mask_full")]
    dst = tmp_path / "app.db"
    dst.write_bytes(b"an encrypted database")
    (tmp_path / "dangling").symlink_to(tmp_path / "nothing")
    for target in (dst, tmp_path / "dangling", src):
        with pytest.raises(FieldError, match="already exists; refusing to replace it"):
            protect_file(src, target, rules, keys, output_format="parquet")
    assert dst.read_bytes() == b"an encrypted database"
    assert os.readlink(tmp_path / "dangling") == str(tmp_path / "nothing")
    assert src.read_text() == "pan\n4111111111111111\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".protect-")]
    protect_file(src, dst, rules, keys, output_format="parquet", replace=True)
    assert pq.read_table(dst).column("pan").to_pylist() == ["****************"]


def test_an_output_made_while_protect_runs_is_not_replaced(tmp_path, keys, monkeypatch):
    """The output's name is checked free before the run and taken by a hard link after
    it, so a file that took the name meanwhile is kept (a rename would replace it)."""
    from cryptdisk.fields import _protect

    src = tmp_path / "in.csv"
    src.write_text("pan\n4111111111111111\n")
    dst = tmp_path / "out.parquet"
    real = _protect.protect_table

    def racing(*args, **kwargs):
        dst.write_bytes(b"made meanwhile")
        return real(*args, **kwargs)

    monkeypatch.setattr(_protect, "protect_table", racing)
    with pytest.raises(FieldError, match="already exists \\(made while protect ran\\)"):
        protect_file(src, dst, [parse_rule("pan=mask_full")], keys)
    assert dst.read_bytes() == b"made meanwhile"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".protect-")]


def test_an_empty_input_gives_an_empty_protected_output(tmp_path, keys):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"pan": pa.array([], pa.string())}), src)
    summary = protect_file(src, tmp_path / "out.parquet", [parse_rule("pan=encrypt:cards")],
                           keys)
    assert summary.rows == 0 and pq.read_table(tmp_path / "out.parquet").num_rows == 0


def test_cli_end_to_end(tmp_path, config):
    src = tmp_path / "in.csv"
    src.write_text("pan,name\n4111111111111111,alice\n")
    env = {**os.environ, "PYTHONPATH": SRC}
    run = subprocess.run(
        [sys.executable, "-m", "cryptdisk", "protect", str(src), str(tmp_path / "o.csv"),
         "-c", str(config), "-r", "pan=tokenize:cards,keep_first=6,keep_last=4,luhn=true",
         "-r", "name=mask_full"], capture_output=True, text=True, env=env, check=False)
    assert run.returncode == 0, run.stderr
    assert "protected 1 rows" in run.stderr
    row = pacsv.read_csv(tmp_path / "o.csv", convert_options=pacsv.ConvertOptions(
        column_types={"pan": pa.string()})).to_pylist()[0]
    assert row["name"] == "*****" and row["pan"][:6] == "411111" and row["pan"][-4:] == "1111"
    assert row["pan"] != "4111111111111111"
    bad = subprocess.run(
        [sys.executable, "-m", "cryptdisk", "protect", str(src), str(tmp_path / "p.csv"),
         "-c", str(config), "-r", "pan=fpe_encrypt:nope"],
        capture_output=True, text=True, env=env, check=False)
    assert bad.returncode == 1 and "no field key named 'nope'" in bad.stderr
    assert CARDS not in bad.stderr and not (tmp_path / "p.csv").exists()


def test_killed_mid_way_the_output_is_the_old_one(tmp_path, config):
    src = tmp_path / "in.parquet"
    pans = [f"{4000000000000000 + i}" for i in range(150_000)]  # 3 batches of 65,536
    pq.write_table(pa.table({"pan": pans}), src)
    dst = tmp_path / "out.parquet"
    dst.write_bytes(b"old")
    with subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("protect_child.py")), str(src),
             str(dst), str(config)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": SRC}) as child:
        try:
            assert child.stdout.readline().strip() == "batch 1"
            child.stdin.write("\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "batch 2"  # one written, one pending
        finally:
            child.kill()
            child.wait()
    assert dst.read_bytes() == b"old"
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".protect-")]
    for path in leftovers:  # a killed run's temporary holds protected values only
        assert pans[0].encode() not in path.read_bytes()


@pytest.fixture
def db(tmp_path, monkeypatch):
    from tests.fields.conftest import CONFIG

    monkeypatch.setenv("CRYPTDISK_TEST_EMAILS_KEY", "ab" * 32)
    path = tmp_path / "db.toml"
    path.write_text(CONFIG)
    with cryptdisk.connect(tmp_path / "db", str(path)) as database:
        database.sql("CREATE TABLE pay (id BIGINT, pan VARCHAR, email VARCHAR)")
        yield database


def test_protect_insert_streams_a_csv_into_a_table(tmp_path, db):
    from cryptdisk.fields import protect_insert

    src = tmp_path / "in.csv"
    src.write_text("id,pan,email\n" + "".join(
        f"{i},{4000000000000000 + i},u{i}@x.org\n" for i in range(3000)))
    rules = [parse_rule("pan=fpe_encrypt:cards"), parse_rule("email=encrypt_deterministic:cards")]
    assert protect_insert(db, "pay", src, rules) == 3000  # keys: the database's config
    stored = db.sql("SELECT pan, email FROM pay ORDER BY id LIMIT 1").to_pylist()[0]
    assert stored["pan"] != "4000000000000000" and len(stored["pan"]) == 16
    assert db.sql("SELECT fpe_decrypt(pan, 'cards', col := 'pan') AS p, "
                  "decrypt_deterministic(email, 'cards') AS e FROM pay WHERE id = 7"
                  ).to_pylist() == [{"p": "4000000000000007", "e": "u7@x.org"}]
    # the parts on disk never hold the clear values
    for root, _dirs, files in os.walk(tmp_path / "data"):
        for name in files:
            raw = Path(root, name).read_bytes()
            assert b"4000000000000007" not in raw and b"u7@x.org" not in raw


def test_protect_insert_is_all_or_nothing(db):
    from cryptdisk.fields import protect_insert

    good = [str(4000000000000000 + i) for i in range(70_000)]
    bad = [*good, "12345"]  # too short for FF1, in the second batch
    data = pa.table({"id": pa.array(range(len(bad)), pa.int64()), "pan": bad,
                     "email": ["e"] * len(bad)})
    with pytest.raises(FieldError) as info:
        protect_insert(db, "pay", data.to_reader(max_chunksize=65_536),
                       [parse_rule("pan=fpe_encrypt:cards")])
    assert "12345" not in str(info.value)
    assert db.sql("SELECT count(*) AS n FROM pay").to_pylist() == [{"n": 0}]


def test_cryptdisk_protect_into_a_table(tmp_path, db):
    src = tmp_path / "in.csv"
    src.write_text("id,pan,email\n1,4111111111111111,a@x.org\n")
    config = str(tmp_path / "db.toml")
    db_path = str(tmp_path / "db")
    db.close()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (SRC, os.environ.get("PYTHONPATH")) if p))
    run = subprocess.run([sys.executable, "-m", "cryptdisk", "protect", str(src), "-c", config,
                          "--into", f"{db_path}:pay", "-r", "pan=tokenize:cards,keep_last=4"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "inserted 1 rows into pay" in run.stderr
    with cryptdisk.connect(db_path, config) as again:
        pan = again.sql("SELECT pan FROM pay").to_pylist()[0]["pan"]
    assert pan.endswith("1111") and pan != "4111111111111111"
    both = subprocess.run([sys.executable, "-m", "cryptdisk", "protect", str(src), "out.csv",
                           "-c", config, "--into", f"{db_path}:pay", "-r", "pan=mask_full"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert both.returncode != 0 and "not both" in both.stderr


def test_an_error_names_the_column_and_the_row_of_the_whole_input(tmp_path, keys, db):
    from cryptdisk.fields import protect_insert

    # the bad value is in the input's second batch (65,536 rows each): its row counts
    # from the input's first row, not from its batch's
    pans = [str(4000000000000000 + i) for i in range(70_000)] + ["12345"]
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": pa.array(range(len(pans)), pa.int64()), "pan": pans,
                             "email": ["e"] * len(pans)}), src)
    rules = [parse_rule("email=mask_full"), parse_rule("pan=fpe_encrypt:cards")]
    want = r"column 'pan': fpe_encrypt: row 70000 has 5 characters"
    with pytest.raises(FieldError, match=want):
        protect_file(src, tmp_path / "out.parquet", rules, keys)
    with pytest.raises(FieldError, match=want):
        protect_insert(db, "pay", src, rules)


def test_protect_file_writes_binary_ciphertexts_to_parquet(tmp_path, keys):
    src = tmp_path / "in.csv"
    src.write_text("id,name,email\n1,Zoë 名前,a@x.org\n2,,\n3,Bob,a@x.org\n")
    rules = [parse_rule("name=encrypt:cards"), parse_rule("email=encrypt_deterministic:cards")]
    protect_file(src, tmp_path / "b64.parquet", rules, keys)
    protect_file(src, tmp_path / "bin.parquet", rules, keys, ciphertexts="binary")
    b64, binary = pq.read_table(tmp_path / "b64.parquet"), pq.read_table(tmp_path / "bin.parquet")
    assert b64.schema.field("name").type == pa.string()
    assert binary.schema.field("name").type == binary.schema.field("email").type == pa.binary()
    assert binary.column("id").to_pylist() == ["1", "2", "3"]
    assert decrypt(binary.column("name"), keys["cards"]).to_pylist() == ["Zoë 名前", None, "Bob"]
    email = binary.column("email").to_pylist()
    assert email[0] == email[2] and len(email[0]) == len(base64.b64decode(
        b64.column("email").to_pylist()[0]))  # the same bytes, without base64's third
    assert decrypt_deterministic(binary.column("email"), keys["cards"]).to_pylist() == [
        "a@x.org", None, "a@x.org"]
    # a CSV holds text: refused before anything is written
    with pytest.raises(FieldError, match="binary ciphertexts need a Parquet output"):
        protect_file(src, tmp_path / "out.csv", rules, keys, ciphertexts="binary")
    assert not (tmp_path / "out.csv").exists()
    # the option is only about ciphertexts: a CSV of tokens and masks is fine
    protect_file(src, tmp_path / "mask.csv", [parse_rule("name=mask_full")], keys,
                 ciphertexts="binary")
    with pytest.raises(ValueError, match="'base64' or 'binary'"):
        protect_file(src, tmp_path / "x.parquet", rules, keys, ciphertexts="hex")


def test_protect_insert_writes_the_form_of_the_tables_column(tmp_path, db):
    from cryptdisk.fields import protect_insert

    db.sql("CREATE TABLE blobs (id BIGINT, pan BLOB, email BYTEA, note VARCHAR)")
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "pan": ["4111111111111111", None],
                     "email": ["a@x.org", "b@x.org"], "note": ["n1", "n2"]})
    rules = [parse_rule("pan=encrypt:cards"), parse_rule("email=encrypt_deterministic:cards"),
             parse_rule("note=encrypt:cards")]
    # BLOB columns get the bytes, the VARCHAR column base64 text, and all decrypt in SQL
    assert protect_insert(db, "blobs", data, rules) == 2
    assert db.sql("SELECT decrypt(pan, 'cards') AS p, decrypt_deterministic(email, 'cards') "
                  "AS e, decrypt(note, 'cards') AS n, typeof(pan) AS t FROM blobs ORDER BY id"
                  ).to_pylist() == [
        {"p": "4111111111111111", "e": "a@x.org", "n": "n1", "t": "BLOB"},
        {"p": None, "e": "b@x.org", "n": "n2", "t": "BLOB"}]
    # a form given that the column cannot hold is refused, and nothing is inserted
    for form, column, declared in [("binary", "note", "VARCHAR"), ("base64", "pan", "BLOB")]:
        with pytest.raises(FieldError, match=f"column '{column}' of table 'blobs' is "
                           f"{declared}: {form} ciphertexts go into"):
            protect_insert(db, "blobs", data, rules, ciphertexts=form)
    assert protect_insert(db, "blobs", data, rules[:2], ciphertexts="binary") == 2
    assert db.sql("SELECT count(*) AS n FROM blobs").to_pylist() == [{"n": 4}]


def test_cryptdisk_protect_binary_ciphertexts(tmp_path, db):
    src = tmp_path / "in.csv"
    src.write_text("id,pan,email\n1,4111111111111111,a@x.org\n")
    config = str(tmp_path / "db.toml")
    db.sql("CREATE TABLE blobs (id BIGINT, pan BLOB, email VARCHAR)")
    db_path = str(tmp_path / "db")
    db.close()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (SRC, os.environ.get("PYTHONPATH")) if p))

    def protect(*args):
        return subprocess.run([sys.executable, "-m", "cryptdisk", "protect", str(src), *args,
                               "-c", config], capture_output=True, text=True, env=env,
                              timeout=300)

    run = protect(str(tmp_path / "out.parquet"), "--ciphertexts", "binary", "-r",
                  "pan=encrypt:cards")
    assert run.returncode == 0, run.stderr
    assert pq.read_table(tmp_path / "out.parquet").schema.field("pan").type == pa.binary()
    run = protect("--into", f"{db_path}:blobs", "-r", "pan=encrypt:cards",
                  "-r", "email=encrypt_deterministic:cards")
    assert run.returncode == 0, run.stderr
    with cryptdisk.connect(db_path, config) as again:
        assert again.sql("SELECT decrypt(pan, 'cards') AS p, decrypt_deterministic(email, "
                         "'cards') AS e FROM blobs").to_pylist() == [
            {"p": "4111111111111111", "e": "a@x.org"}]
    bad = protect(str(tmp_path / "out.csv"), "--ciphertexts", "binary", "-r",
                  "pan=encrypt:cards")
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "cryptdisk: error:" in bad.stderr and "need a Parquet output" in bad.stderr


def test_columns_that_are_not_text(tmp_path, keys):
    from cryptdisk.fields import mask_full

    table = pa.table({"raw": pa.array([b"\xff\xfe", b"ok", None]),
                      "lst": pa.array([[1], [2, 3], None])})
    # bytes are encrypted as they are (decrypt with output='binary' gives them back)
    out = protect_table(table, [parse_rule("raw=encrypt:cards")], keys)
    assert decrypt(out.column("raw"), keys["cards"], output="binary").to_pylist() == \
        [b"\xff\xfe", b"ok", None]
    # bytes that are not UTF-8 cannot be text: the row is named, never the bytes
    with pytest.raises(FieldError, match=r"column 'raw': row 3 is not UTF-8 text") as info:
        protect_table(table, [parse_rule("raw=mask_full")], keys, first_row=3)
    assert "\\xff" not in str(info.value)
    assert protect_table(table.slice(1), [parse_rule("raw=mask_full")], keys).column(
        "raw").to_pylist() == mask_full(["ok", None]).to_pylist()
    with pytest.raises(FieldError, match=r"column 'lst' is list<item: int64>: protect takes "
                       "columns of text, numbers, dates or bytes"):
        protect_table(table, [parse_rule("lst=encrypt:cards")], keys)
    src = tmp_path / "in.parquet"
    pq.write_table(table, src)
    with pytest.raises(FieldError, match="column 'raw': row 0 is not UTF-8"):
        protect_file(src, tmp_path / "out.parquet", [parse_rule("raw=tokenize:cards")], keys)


def test_a_csvs_other_columns_pass_through_as_their_text(tmp_path, keys, db):
    from cryptdisk.fields import protect_insert

    src = tmp_path / "in.csv"
    src.write_text("id,zip,amount,day,pan\n1,01234,2.00,2024-01-02,4111111111111111\n"
                   "2,,1e3,,5500005555555559\n")
    rules = [parse_rule("pan=fpe_encrypt:cards")]
    protect_file(src, tmp_path / "out.csv", rules, keys)
    lines = (tmp_path / "out.csv").read_text().splitlines()
    assert [line.rsplit(",", 1)[0] for line in lines] == [
        '"id","zip","amount","day"', '"1","01234","2.00","2024-01-02"', '"2",,"1e3",']
    protect_file(src, tmp_path / "out.parquet", rules, keys)
    out = pq.read_table(tmp_path / "out.parquet")
    assert out.column("zip").to_pylist() == ["01234", None]
    assert out.column("amount").to_pylist() == ["2.00", "1e3"]
    # into a table, the table's types convert the text; an empty field is NULL, as
    # db.insert reads a CSV
    db.sql("CREATE TABLE typed (id BIGINT, zip VARCHAR, amount DOUBLE, day DATE, pan VARCHAR)")
    assert protect_insert(db, "typed", src, rules) == 2
    assert db.sql("SELECT id, zip, amount, day, fpe_decrypt(pan, 'cards', col := 'pan') AS pan "
                  "FROM typed ORDER BY id").to_pylist() == [
        {"id": 1, "zip": "01234", "amount": 2.0, "day": datetime.date(2024, 1, 2),
         "pan": "4111111111111111"},
        {"id": 2, "zip": None, "amount": 1000.0, "day": None, "pan": "5500005555555559"}]


def test_an_output_that_cannot_be_written_is_named(tmp_path, keys):
    src = tmp_path / "in.csv"
    src.write_text("pan\n4111111111111111\n")
    rules = [parse_rule("pan=mask_full")]
    with pytest.raises(FieldError, match=f"cannot write {tmp_path}: it is a directory"):
        protect_file(src, tmp_path, rules, keys)
    missing = tmp_path / "no" / "out.csv"
    with pytest.raises(FieldError, match=f"cannot write {missing}: no directory "
                       f"{tmp_path / 'no'}"):
        protect_file(src, missing, rules, keys)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".protect-")]


def test_two_rules_for_one_column_are_refused(tmp_path, keys):
    # the second would protect the first one's output (a mask of a ciphertext)
    rules = [parse_rule("pan=encrypt:cards"), parse_rule("pan=mask_full")]
    with pytest.raises(FieldError, match="two rules for column 'pan'"):
        protect_table(pa.table({"pan": ["4111111111111111"]}), rules, keys)


def test_an_empty_csv_field_is_null(tmp_path, keys, db):
    from cryptdisk.fields import protect_insert

    # a customer without a card number: FF1 cannot take an empty value, and needs not
    src = tmp_path / "in.csv"
    src.write_text('id,pan,email,note\n1,4111111111111111,a@x.org,NA\n2,,"",null\n')
    rules = [parse_rule("pan=tokenize:cards,keep_first=6,keep_last=4,luhn=true"),
             parse_rule("email=encrypt:cards")]
    protect_file(src, tmp_path / "out.parquet", rules, keys)
    out = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert out[1] == {"id": "2", "pan": None, "email": None, "note": "null"}
    assert out[0]["note"] == "NA"  # only an empty field is NULL
    protect_file(src, tmp_path / "out.csv", rules, keys)
    assert (tmp_path / "out.csv").read_text().splitlines()[2] == '"2",,,"null"'
    src.write_text('id,pan,email\n1,4111111111111111,a@x.org\n2,,""\n')
    assert protect_insert(db, "pay", src, rules) == 2
    assert db.sql("SELECT pan, email FROM pay WHERE id = 2").to_pylist() == [
        {"pan": None, "email": None}]


def test_rule_columns_match_the_header_in_any_case(tmp_path, config, db):
    from cryptdisk.fields import protect_insert

    # the header says PAN and Email, the rules pan and EMAIL, as the database would take them
    src = tmp_path / "in.csv"
    src.write_text("Id,PAN,Email\n1,4111111111111111,a@x.org\n")
    env = {**os.environ, "PYTHONPATH": SRC}
    run = subprocess.run(
        [sys.executable, "-m", "cryptdisk", "protect", str(src), str(tmp_path / "o.parquet"),
         "-c", str(config), "-r", "pan=fpe_encrypt:cards", "-r", "EMAIL=mask_email"],
        capture_output=True, text=True, env=env, check=False)
    assert run.returncode == 0, run.stderr
    out = pq.read_table(tmp_path / "o.parquet")
    assert out.column_names == ["Id", "PAN", "Email"]  # the input's names stay
    keys = FieldKeys.from_config(config)
    # the tweak is the rule's column name, as with col := 'pan' in SQL
    assert out.column("PAN").to_pylist() != ["4111111111111111"]
    assert fpe_decrypt(out.column("PAN"), keys["cards"], "pan").to_pylist() == [
        "4111111111111111"]
    assert out.column("Email").to_pylist() == ["****@x.org"]
    assert protect_insert(db, "pay", src, [parse_rule("PAN=tokenize:cards,keep_last=4")],
                          keys) == 1
    assert db.sql("SELECT pan FROM pay").to_pylist()[0]["pan"] != "4111111111111111"


def test_rule_columns_differing_only_in_case_are_refused(tmp_path, config, keys):
    src = tmp_path / "in.csv"
    src.write_text("pan,PAN\n4111111111111111,5500005555555559\n")
    env = {**os.environ, "PYTHONPATH": SRC}
    run = subprocess.run(
        [sys.executable, "-m", "cryptdisk", "protect", str(src), str(tmp_path / "o.csv"),
         "-c", str(config), "-r", "pan=mask_full"],
        capture_output=True, text=True, env=env, check=False)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert "column 'pan' is ambiguous: the input has 'pan' and 'PAN'" in run.stderr
    assert not (tmp_path / "o.csv").exists()
    with pytest.raises(FieldError, match="two rules for column 'PAN'"):
        protect_table(pa.table({"pan": ["4111111111111111"]}),
                      [parse_rule("pan=mask_full"), parse_rule("PAN=mask_null")], keys)
