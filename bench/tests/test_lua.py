"""The wrk scripts: what each template becomes once filled."""

import re
import zlib

from benchkit import lua


def unfilled(text):
    """Placeholders left in a script (Lua tables use braces too, but never around a bare name)."""
    return re.findall(r"\{(key|limit|seed|ratio|hot|fill|keyed)\}", text)


def test_plain_script():
    s = lua.WRK_LUA.format(key="r0-nginx-thr")
    assert 'wrk.body = "{}"' in s
    assert 'wrk.headers["x-fake-key"] = "r0-nginx-thr"' in s
    assert "'WRKJSON {\"requests\":%d,\"duration_us\":%d," in s
    assert "\\n',\n" in s  # done() ends its line: the harness reads it line by line
    assert not unfilled(s)


def test_keyed_scripts_number_their_keys():
    s = lua.WRK_IDEM_LUA.format(key="k", limit=12000)
    assert 'wrk.headers["Idempotency-Key"] = "k-" .. sent' in s
    assert "local sent, answered, limit = 0, 0, 12000" in s
    s = lua.WRK_KEYED_LUA.format(key="r1-policy-plain")
    assert 'wrk.headers["Idempotency-Key"] = "r1-policy-plain-" .. tid .. "-" .. sent' in s
    assert '"sent":%d,"answered":%d,"non2xx":%d,' in s
    assert not unfilled(s)


def test_cache_script_is_seeded_from_the_phase():
    s = lua.cache_lua("r0-cache-cached", 0.9, 16).format(key="r0-cache-cached")
    assert f"math.randomseed({zlib.crc32(b'r0-cache-cached')})" in s
    assert "if math.random() < 0.9 then" in s
    assert """body = '{"model":"m","hot":' .. (n % 16) .. '}'""" in s
    assert """body = '{"model":"m","cold":"r0-cache-cached-' .. n .. '"}'""" in s
    assert not unfilled(s)
    assert lua.cache_lua("r1-cache-cached", 0.9, 16) != lua.cache_lua("r0-cache-cached", 0.9, 16)


def test_body_scripts():
    s = lua.body_lua("string", 1 << 20, keyed=False).format(key="b")
    assert """wrk.body = '{"model":"m","input":"' .. string.rep("x", 1048550) .. '"}'""" in s
    assert "local keyed, n = false, 0" in s
    s = lua.body_lua("chat", 256 << 10, keyed=True).format(key="b")
    assert "math.floor((262118) / (#item + 1))" in s
    assert """wrk.body = '{"model":"m","messages":[' .. table.concat(items, ",") .. ']}'""" in s
    assert "local keyed, n = true, 0" in s
    assert not unfilled(s)
