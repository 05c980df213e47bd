"""The server side of a shared RateLimit: the Lua scripts Redis runs, each one atomic step
(``connectors/_rate_limit.py`` has the contract). Keys live under
``asyncio_ops:rate:<name>:``; every script renews the time to live of what it touches."""

from __future__ import annotations

from typing import Final

__all__ = ["PAUSE", "RESERVE", "RESTORE_WINDOW", "SETTINGS", "TOTAL"]

RESTORE_WINDOW: Final = 60.0
"""Seconds after a record was restored during which every client's floor raises it."""
_WINDOW_MS: Final = str(int(RESTORE_WINDOW * 1000))

# KEYS: bucket, pause, restored. ARGV: interval (s per unit), tolerance (burst * interval),
# units, ttl slack (ms), now (s; "" for the server's clock), floor (the bucket's value after
# this client's last reservation, on the server's clock; "" none). Returns, as strings: when
# the first reserved unit is due relative to now (s, may be negative; unit i is due i
# intervals later), now, the bucket's value after this reservation, and "1" if the floor
# restored a lost record ("0" if not).
#
# A record lost (the key gone, yet this client has reserved past now) restarts from the
# floor, and for RESTORE_WINDOW_MS every client's floor raises it (``restored``), so that
# it soon holds the latest slot any client was granted.
RESERVE: Final = """
local now = tonumber(ARGV[5])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1e6
end
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local units = tonumber(ARGV[3])
local held = redis.call('GET', KEYS[1])
local tat = tonumber(held or '0')
local restored = '0'
local floor = tonumber(ARGV[6])
if floor and floor > now and floor > tat
   and (not held or redis.call('EXISTS', KEYS[3]) == 1) then
  tat = floor
  restored = '1'
  redis.call('SET', KEYS[3], '1', 'PX', RESTORE_WINDOW_MS)
end
if tat < now then tat = now end
local paused = redis.call('PTTL', KEYS[2])
if paused > 0 and tat < now + paused / 1000 + tolerance - interval then
  tat = now + paused / 1000 + tolerance - interval
end
local new_tat = tat + units * interval
local ttl = math.ceil((new_tat - now) * 1000) + tonumber(ARGV[4])
redis.call('SET', KEYS[1], string.format('%.6f', new_tat), 'PX', ttl)
return {string.format('%.6f', tat + interval - tolerance - now), string.format('%.6f', now),
        string.format('%.6f', new_tat), restored}
""".replace("RESTORE_WINDOW_MS", _WINDOW_MS)


# KEYS: pause, requests bucket, tokens bucket. ARGV: milliseconds. A longer pause than the
# one in force replaces it, and the reservations not yet due move that much later.
PAUSE: Final = """
local ms = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) >= ms then return 0 end
redis.call('SET', KEYS[1], '1', 'PX', ms)
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
for i = 2, 3 do
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tat > now then
    redis.call('SET', KEYS[i], string.format('%.6f', tat + ms / 1000), 'PX',
               math.ceil((tat + ms / 1000 - now) * 1000) + 60000)
  end
end
return 1
"""


# KEYS: total, restored. ARGV: units (may be negative), maximum (-1: none), ttl (ms), floor
# (the total after this client's last change; "" none). Adds units to the total unless that
# passes the maximum; returns {1 added / 0 refused, the total, 1 if the floor restored a
# lost total}. A total lost (the key gone while this client saw it above 0) restarts from
# the floor, and for RESTORE_WINDOW_MS every client's floor raises it.
TOTAL: Final = """
local held = redis.call('GET', KEYS[1])
local total = tonumber(held or '0')
local units = tonumber(ARGV[1])
local maximum = tonumber(ARGV[2])
local floor = tonumber(ARGV[4])
local restored = 0
if floor and floor > total and (not held or redis.call('EXISTS', KEYS[2]) == 1) then
  total = floor
  restored = 1
  redis.call('SET', KEYS[1], total, 'PX', ARGV[3])
  redis.call('SET', KEYS[2], '1', 'PX', RESTORE_WINDOW_MS)
end
if units > 0 and maximum >= 0 and total + units > maximum then
  return {0, total, restored}
end
total = redis.call('INCRBY', KEYS[1], units)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, total, restored}
""".replace("RESTORE_WINDOW_MS", _WINDOW_MS)


# KEYS: settings. ARGV: this process's settings (JSON), ttl (ms). The settings the name
# was first used with (set now if none), their time to live renewed.
SETTINGS: Final = """
local held = redis.call('GET', KEYS[1])
if not held then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return held
"""
