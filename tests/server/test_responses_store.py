"""anna-serve --responses-db: stored /v1/responses in SQLite, across restarts, with the openai client.

The tiny qwen3 fixture has random weights: replies are forced with --debug-hooks
("anna_debug_output"), ending in <|im_end|> where a chain must splice the stored token ids."""
import os
import sqlite3
import subprocess
import time

import openai
import pytest

from conftest import FIXTURES, server_bin, start_server

MODEL = "qwen3"
QWEN3 = os.path.join(FIXTURES, "qwen3")


def forced(text):
    return {"anna_debug_output": text}


def serve(db, *args):
    return start_server(QWEN3, "--parallel", "2", "--ctx-size", "1024", "--debug-hooks", "--reasoning-format",
                        "deepseek", "--responses-db", str(db), *args)


def rows(db):
    con = sqlite3.connect(str(db), timeout=5)
    try:
        return {r[0]: r[1] for r in con.execute("SELECT id, created FROM responses")}
    finally:
        con.close()


def test_restart_get_items_and_chain(tmp_path):
    db = tmp_path / "responses.db"
    s = serve(db, "--responses-store-max", "8")
    try:
        c = s.client()
        r1 = c.responses.create(model=MODEL, input="Why?", extra_body=forced(
            "<think>Because the sky scatters blue light more than red light.</think>Rayleigh.<|im_end|>"))
        assert [o.type for o in r1.output] == ["reasoning", "message"]
        kept = c.responses.create(model=MODEL, input="not stored", store=False, extra_body=forced("x"))
        events = list(c.responses.create(model=MODEL, input="streamed", stream=True, extra_body=forced("Streamed.")))
        rs = events[-1].response
        assert events[-1].type == "response.completed" and rs.output_text == "Streamed."
        # the reference chain on the first server: the stored ids keep the old <think> text
        r2a = c.responses.create(model=MODEL, input="And at sunset?", previous_response_id=r1.id,
                                 extra_body=forced("Longer path.<|im_end|>"))
        before = c.responses.retrieve(r1.id).model_dump()
        items_before = [i.model_dump() for i in c.responses.input_items.list(r1.id, order="asc").data]
        c.responses.delete(r2a.id)
    finally:
        s.stop()
    assert set(rows(db)) == {r1.id, rs.id}  # store: false is not persisted

    # A fresh process whose memory cache holds one entry: every other read goes to the file.
    s = serve(db, "--responses-store-max", "1")
    try:
        c = s.client()
        assert c.responses.retrieve(r1.id).model_dump() == before
        assert [i.model_dump() for i in c.responses.input_items.list(r1.id, order="asc").data] == items_before
        assert c.responses.retrieve(rs.id).output_text == "Streamed."
        for gone in (kept.id, r2a.id):
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(gone)
        # the chain starts from the stored ids: the same prompt as before the restart (a
        # re-render would drop the old <think> text and be shorter)
        r2 = c.responses.create(model=MODEL, input="And at sunset?", previous_response_id=r1.id,
                                extra_body=forced("Longer path.<|im_end|>"))
        assert r2.usage.input_tokens == r2a.usage.input_tokens, (r2.usage, r2a.usage)
        assert r2.output_text == "Longer path."
        c.responses.retrieve(rs.id)  # evicts r2 from the one-entry cache: the next read is the file's
        r3 = c.responses.create(model=MODEL, input="And at noon?", previous_response_id=r2.id,
                                extra_body=forced("Short path.<|im_end|>"))
        # r2's prompt + reply ids, read back from the file, are a prefix-cache hit
        assert r3.usage.input_tokens_details.cached_tokens >= r2.usage.input_tokens + r2.usage.output_tokens - 1, \
            (r2.usage, r3.usage)
    finally:
        s.stop()


def test_ttl_expiry_and_sweep(tmp_path):
    db = tmp_path / "ttl.db"
    s = serve(db, "--responses-ttl", "2")
    try:
        c = s.client()
        r = c.responses.create(model=MODEL, input="short-lived", extra_body=forced("bye"))
        unread = c.responses.create(model=MODEL, input="never read again", extra_body=forced("bye"))
        assert c.responses.retrieve(r.id).id == r.id
        assert set(rows(db)) == {r.id, unread.id}
        time.sleep(3.2)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.create(model=MODEL, input="x", previous_response_id=r.id, extra_body=forced("y"))
        with pytest.raises(openai.NotFoundError):
            c.responses.delete(r.id)
        # the periodic sweep (every ttl/2 here) deleted the unread one without any request
        deadline = time.time() + 5
        while rows(db) and time.time() < deadline:
            time.sleep(0.2)
        assert rows(db) == {}
    finally:
        s.stop()
    # expired stays expired across a restart (rows written before, read after)
    con = sqlite3.connect(str(db))
    con.execute("INSERT INTO responses(id, created, response, input_items, ctx_msgs, no_think) "
                "VALUES('resp_old', 1, '{\"id\": \"resp_old\", \"object\": \"response\"}', '[]', '[]', 0)")
    con.commit()
    con.close()
    s = serve(db, "--responses-ttl", "3600")
    try:
        with pytest.raises(openai.NotFoundError):
            s.client().responses.retrieve("resp_old")
        assert "resp_old" not in rows(db)
    finally:
        s.stop()


def test_delete_persists(tmp_path):
    db = tmp_path / "del.db"
    s = serve(db)
    try:
        c = s.client()
        r = c.responses.create(model=MODEL, input="delete me", extra_body=forced("ok"))
        keep = c.responses.create(model=MODEL, input="keep me", extra_body=forced("ok"))
        d = c.responses.delete(r.id)
        assert d is None or getattr(d, "deleted", True)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.delete(r.id)
        assert set(rows(db)) == {keep.id}
    finally:
        s.stop()
    s = serve(db)
    try:
        c = s.client()
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)
        assert c.responses.retrieve(keep.id).output_text == "ok"
    finally:
        s.stop()


def start_fails(db, timeout=60):
    p = subprocess.run([server_bin(), "--model-dir", QWEN3, "--port", "0", "--threads", "2", "--responses-db", str(db)],
                       capture_output=True, text=True, timeout=timeout)
    assert p.returncode != 0, p.stderr
    assert "Sanitizer" not in p.stderr, p.stderr
    return p.stderr


def test_bad_files_are_startup_errors(tmp_path):
    bad = tmp_path / "corrupt.db"
    bad.write_bytes(b"this is not a database " * 100)
    err = start_fails(bad)
    assert str(bad) in err and "file is not a database" in err, err
    err = start_fails(tmp_path / "no" / "such" / "folder" / "x.db")
    assert "unable to open database file" in err, err
    newer = tmp_path / "newer.db"
    con = sqlite3.connect(str(newer))
    con.execute("CREATE TABLE anna_schema(version INTEGER NOT NULL)")
    con.execute("INSERT INTO anna_schema VALUES(99)")
    con.commit()
    con.close()
    err = start_fails(newer)
    assert "schema version 99" in err and "version 1" in err, err
    # another process holds the file's write lock: a clear error after the busy timeout
    locked = tmp_path / "locked.db"
    con = sqlite3.connect(str(locked), isolation_level=None)
    con.execute("CREATE TABLE t(x)")
    con.execute("BEGIN EXCLUSIVE")
    try:
        err = start_fails(locked)
        assert "database is locked" in err and str(locked) in err, err
    finally:
        con.execute("ROLLBACK")
        con.close()


def test_db_failure_at_run_time_is_a_500(tmp_path):
    """The file breaks under a running server (its table dropped by another process): storing
    and reading are 500s naming SQLite's cause, and the server keeps serving."""
    db = tmp_path / "broken.db"
    s = serve(db)
    try:
        c = s.client()
        r = c.responses.create(model=MODEL, input="stored", extra_body=forced("ok"))
        con = sqlite3.connect(str(db))
        con.execute("DROP TABLE responses")
        con.commit()
        con.close()
        with pytest.raises(openai.InternalServerError) as ei:
            c.responses.create(model=MODEL, input="after", extra_body=forced("ok"))
        assert "could not be stored" in str(ei.value) and "no such table" in str(ei.value), ei.value
        events = list(c.responses.create(model=MODEL, input="after", stream=True, extra_body=forced("ok")))
        assert events[-1].type == "response.failed" and "no such table" in events[-1].response.error.message
        # r is still in the memory cache; an id only the file could answer is a 500
        assert c.responses.retrieve(r.id).id == r.id
        with pytest.raises(openai.InternalServerError) as ei:
            c.responses.retrieve("resp_only_on_disk")
        assert "no such table" in str(ei.value)
        # store: false never touches the file
        ok = c.responses.create(model=MODEL, input="x", store=False, extra_body=forced("fine"))
        assert ok.output_text == "fine"
    finally:
        s.stop()


def test_memory_only_flags():
    """Without --responses-db nothing changes; --responses-ttl applies to the memory store too."""
    s = start_server(QWEN3, "--parallel", "2", "--ctx-size", "1024", "--debug-hooks", "--responses-ttl", "1")
    try:
        c = s.client()
        r = c.responses.create(model=MODEL, input="hi", extra_body=forced("ok"))
        assert c.responses.retrieve(r.id).id == r.id
        time.sleep(1.5)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)
    finally:
        s.stop()
