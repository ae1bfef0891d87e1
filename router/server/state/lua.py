"""The Lua scripts of :class:`router.server.state.redis_store.RedisStore` (each runs atomically in Redis).

Every epoch-checking script starts with :data:`CHECK`: ``KEYS[2]`` = the epoch key, ``ARGV[1]`` =
the epoch the caller knows (``''`` = do not check); a mismatch answers ``{-1, current epoch or ''}``
and changes nothing.

- :data:`GET`: a run's pin (epoch-checked).
- :data:`EPOCH`: the data set's epoch token, set to ``ARGV[1]`` when there is none.
- :data:`ADMIT` / :data:`RELEASE`: the admission counter, INCR under a limit / DECR floored at 0.
- :data:`ADJUST`: add a delta to a counter, floored at 0 (resync of degraded-mode admissions).
- :data:`BEGIN`: a step's pin and its index in one round trip: ``n = max(counter, floor,
  pin.steps_seen)`` (``steps_seen`` read with ``cjson``), the counter set to ``n + 1`` (with the
  pins' TTL), ``n`` returned (with ``ARGV[4] = '1'`` a run without a counter answers ``{-2}`` and
  nothing changes: the settle after a data loss): an atomic INCR that never goes below what the caller or the pin knows;
  also the run's signal list (``KEYS[4]``, its TTL refreshed), so a step reads its run's signals
  without another round trip.
- :data:`ADD_SIGNAL`: append a signal kind to a run's list (RPUSH, the pins' TTL) unless it holds
  ``ARGV[2]`` already (answers -1); answers the list's length.
- :data:`ADVANCE`: raise a step counter to at least ``ARGV[1]`` (never lower it).
- :data:`UNSTEP`: give back the index just allocated (a rejected new run), only if no later one was.
- :data:`CLAIM`: set-if-absent of a first pin; answers the pin already there, or ``''`` when stored.
- :data:`PUT_NEWER`: the deterministic resync rule for a pin two routers wrote while apart: the
  one with more ``steps_seen`` wins; on a tie the byte-wise smaller JSON text (same on every
  router, whatever order they resync in).
- :data:`RESYNC`: one run's write-back after an outage or a data loss: its pin (the
  :data:`PUT_NEWER` rule, or a delete) and its step counter (the :data:`ADVANCE` rule) in one
  script, so another router never sees the pin without the counter or the counter without the pin.
- :data:`SLOT`: claim (or keep) one of ``ARGV[2]`` router slots under a lease: the first
  ``KEYS[1]..:i`` that is free or already holds this router's token ``ARGV[1]``.
"""

from __future__ import annotations

__all__ = [
    "CHECK",
    "GET",
    "EPOCH",
    "ADMIT",
    "RELEASE",
    "ADJUST",
    "BEGIN",
    "ADVANCE",
    "CLAIM",
    "PUT_NEWER",
    "RESYNC",
    "SLOT",
    "ADD_SIGNAL",
]

CHECK = """
if ARGV[1] ~= '' then
  local e = redis.call('GET', KEYS[2])
  if e ~= ARGV[1] then return {-1, e or ''} end
end
"""

GET = (
    CHECK
    + """
local v = redis.call('GET', KEYS[1])
if v then return {1, v} end
return {0, ''}
"""
)

EPOCH = """
local e = redis.call('GET', KEYS[1])
if e then return e end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
"""

ADMIT = (
    CHECK
    + """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n >= tonumber(ARGV[2]) then return {0, n} end
n = redis.call('INCR', KEYS[1])
local ttl = tonumber(ARGV[3])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return {1, n}
"""
)

RELEASE = (
    CHECK
    + """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n <= 0 then return {1, 0} end
n = redis.call('DECR', KEYS[1])
local ttl = tonumber(ARGV[2])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return {1, n}
"""
)

ADJUST = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0') + tonumber(ARGV[1])
if n < 0 then n = 0 end
redis.call('SET', KEYS[1], n)
local ttl = tonumber(ARGV[2])
if ttl > 0 then redis.call('PEXPIRE', KEYS[1], ttl) end
return n
"""

# KEYS: pin, epoch, step counter, signal list (optional); ARGV: epoch, floor, ttl ms, '1' = answer
# {-2} instead of numbering a run that has no counter (optional)
BEGIN = (
    CHECK
    + """
local pin = redis.call('GET', KEYS[1])
local c = redis.call('GET', KEYS[3])
if not c and ARGV[4] == '1' then return {-2, ''} end
local n = tonumber(c or '0')
local f = tonumber(ARGV[2])
if f > n then n = f end
if pin then
  local ok, d = pcall(cjson.decode, pin)
  if ok and type(d) == 'table' and type(d['steps_seen']) == 'number' and d['steps_seen'] > n then
    n = d['steps_seen']
  end
end
redis.call('SET', KEYS[3], n + 1, 'PX', tonumber(ARGV[3]))
local sig = {}
if KEYS[4] then
  sig = redis.call('LRANGE', KEYS[4], 0, -1)
  if #sig > 0 then redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[3])) end
end
return {1, pin or '', n, sig}
"""
)

# KEYS: step counter; ARGV: next index, ttl ms
ADVANCE = """
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if want > n then
  redis.call('SET', KEYS[1], want, 'PX', tonumber(ARGV[2]))
  return want
end
return n
"""

# KEYS: step counter; ARGV: the index to give back
UNSTEP = """
local n = tonumber(redis.call('GET', KEYS[1]) or '-1')
local i = tonumber(ARGV[1])
if n ~= i + 1 then return 0 end
if i == 0 then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], i, 'KEEPTTL') end
return 1
"""

# KEYS: pin; ARGV: json, ttl ms
CLAIM = """
local v = redis.call('GET', KEYS[1])
if v then return v end
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
return ''
"""

# KEYS: pin; ARGV: json, ttl ms, steps_seen of ARGV[1]
PUT_NEWER = """
local v = redis.call('GET', KEYS[1])
if v then
  local ok, d = pcall(cjson.decode, v)
  local old = -1
  if ok and type(d) == 'table' and type(d['steps_seen']) == 'number' then old = d['steps_seen'] end
  local new = tonumber(ARGV[3])
  if new < old or (new == old and ARGV[1] >= v) then return 0 end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
return 1
"""

# KEYS: pin, step counter; ARGV: 'put' | 'del' | '' (pin untouched), json, ttl ms, steps_seen of
# ARGV[2], next index (-1 = counter untouched); returns 1 when the pin was written or deleted
RESYNC = """
local wrote = 0
if ARGV[1] == 'put' then
  local v = redis.call('GET', KEYS[1])
  local keep = false
  if v then
    local ok, d = pcall(cjson.decode, v)
    local old = -1
    if ok and type(d) == 'table' and type(d['steps_seen']) == 'number' then old = d['steps_seen'] end
    local new = tonumber(ARGV[4])
    keep = new < old or (new == old and ARGV[2] >= v)
  end
  if not keep then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', tonumber(ARGV[3]))
    wrote = 1
  end
elseif ARGV[1] == 'del' then
  wrote = redis.call('DEL', KEYS[1])
end
local want = tonumber(ARGV[5])
if want >= 0 then
  local n = tonumber(redis.call('GET', KEYS[2]) or '0')
  if want > n then redis.call('SET', KEYS[2], want, 'PX', tonumber(ARGV[3])) end
end
return wrote
"""

# KEYS[1]: slot key prefix; ARGV: token, slots, lease ms, preferred slot (-1 = none)
SLOT = """
local pref = tonumber(ARGV[4])
local n = tonumber(ARGV[2])
local order = {}
if pref >= 0 and pref < n then table.insert(order, pref) end
for i = 0, n - 1 do if i ~= pref then table.insert(order, i) end end
for _, i in ipairs(order) do
  local k = KEYS[1] .. i
  local v = redis.call('GET', k)
  if v == ARGV[1] or not v then
    redis.call('SET', k, ARGV[1], 'PX', tonumber(ARGV[3]))
    return i
  end
end
return -1
"""

# KEYS: signal list; ARGV: kind, most signals kept, ttl ms
ADD_SIGNAL = """
local n = redis.call('LLEN', KEYS[1])
if n >= tonumber(ARGV[2]) then return -1 end
n = redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
return n
"""
