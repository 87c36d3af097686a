-- shaper: the shared departure schedule of one lane (GCRA with leases).
-- See sources/redisslots.go and docs/scaling.md.
--
-- KEYS[1]  the lane's hash "{<prefix>:<lane>}:schedule" with fields
--          tat   (theoretical time of the next free slot),
--          pause (end of the shared pause) and
--          seen  (the server's now at the last reserve or pause),
--          all in microseconds of this server's clock, as decimal text.
-- ARGV[1]  "reserve" or "pause".
--
-- reserve  ARGV[2] interval in microseconds (> 0, may have a fraction)
--          ARGV[3] k, the number of consecutive slots to reserve (>= 1)
--          ARGV[4] slack, the burst tolerance in slots (>= 0)
--          ARGV[5] lag in microseconds (>= 0): how far behind now a late
--                  request may place its first slot (the make-up of
--                  lateness); it does not add to the slack: an idle
--                  schedule grants 1 + slack slots up to now, no more
--          returns {start, now, pause}: the slots are start + i*interval
--          for i < k; tat advances to start + k*interval.
-- pause    ARGV[2] length of the pause from now, microseconds (> 0)
--          returns {pause, now}
-- time     returns {now, now} (a clock sample; touches no key)
--
-- The time is the server's (TIME), so the replicas' clocks never enter the
-- schedule. Numbers are returned as text: Redis would truncate Lua numbers
-- to integers, and formats them with too few digits when they are passed
-- to redis.call, hence string.format.

-- Redis < 5 replicates scripts verbatim and refuses a write after TIME
-- unless effects replication is switched on; 5+ does it by default, and
-- 7 keeps the call as a no-op.
if redis.replicate_commands then pcall(redis.replicate_commands) end

local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if ARGV[1] == 'time' then
  return {string.format('%.0f', now), string.format('%.0f', now)}
end
local st = redis.call('HMGET', key, 'tat', 'pause', 'seen')
local tat = tonumber(st[1]) or 0
local pause = tonumber(st[2]) or 0
local seen = tonumber(st[3]) or 0
-- The server's clock never goes back by itself: now < seen means it was
-- stepped back (NTP, an operator, a failover to a server whose clock is
-- behind). Move the schedule back by the step, so that it goes on from
-- where it was instead of holding every replica for the step's length. (A
-- step forward looks like idle time: the schedule then frees at most
-- 1 + slack slots at once, as a fresh key does.) A step back of less than
-- a millisecond is taken for jitter of a virtual machine's clock, not a
-- step: moving the schedule back by it could put one slot more into a
-- window of the shared schedule; holding
-- for it costs at most that millisecond.
if seen - now >= 1000 then
  local step = seen - now
  tat = tat - step
  if pause > 0 then pause = pause - step end
end
local function save()
  redis.call('HSET', key, 'tat', string.format('%.3f', tat), 'pause', string.format('%.3f', pause),
    'seen', string.format('%.0f', now))
end

local function keep()
  -- A schedule whose tat and pause are in the past is the same as no
  -- schedule: let the key expire a minute after that.
  local horizon = math.max(tat, pause) - now
  if horizon < 0 then horizon = 0 end
  redis.call('PEXPIRE', key, string.format('%d', math.floor(horizon / 1000) + 60000))
end

if ARGV[1] == 'pause' then
  local d = tonumber(ARGV[2])
  if not d or d <= 0 then return redis.error_reply('ERR shaper: bad pause length') end
  if now + d > pause then
    pause = now + d
  end
  save()
  keep()
  return {string.format('%.3f', pause), string.format('%.0f', now)}
end

if ARGV[1] ~= 'reserve' then return redis.error_reply('ERR shaper: unknown operation') end
local iv = tonumber(ARGV[2])
local k = tonumber(ARGV[3])
local slack = tonumber(ARGV[4])
local lag = tonumber(ARGV[5])
if not iv or iv <= 0 or not k or k < 1 or not slack or slack < 0 or not lag or lag < 0 then
  return redis.error_reply('ERR shaper: bad reserve arguments')
end
local start = math.max(tat, pause, now - math.max(slack * iv, lag))
tat = start + k * iv
save()
keep()
return {string.format('%.3f', start), string.format('%.0f', now), string.format('%.3f', pause)}
