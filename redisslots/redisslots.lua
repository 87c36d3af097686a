-- shaper: the shared departure schedule of one lane (GCRA with leases).
-- See sources/redisslots.go and docs/scaling.md.
--
-- KEYS[1]  the lane's hash "{<prefix>:<lane>}:schedule" with fields
--          tat   (theoretical time of the next free slot),
--          pause (end of the shared pause) and
--          seen  (the server's now at the last reserve or pause) and
--          owed  (the make-up owed for slots the replicas dropped because
--                they woke too late for them, see ARGV[9]) and
--          comp  (the make-up repaid so far, summed over the slots: the
--                compression of the schedule up to tat),
--          all in microseconds of this server's clock, as decimal text.
-- KEYS[2]  the lane's quota list "{<prefix>:<lane>}:quota" (rate.quota with
--          rate.global): the instants of the newest `count` slots granted,
--          oldest first, microseconds of this server's clock. Every granted
--          slot counts, used or not (the script cannot know); see
--          docs/scaling.md "Quota across replicas".
-- ARGV[1]  "reserve", "pause", "release", "shift" or "time".
--
-- reserve  ARGV[2] interval in microseconds (> 0, may have a fraction)
--          ARGV[3] k, the number of consecutive slots to reserve (>= 1)
--          ARGV[4] slack, the burst tolerance in slots (>= 0)
--          ARGV[5] lag in microseconds (>= 0): how far behind now a late
--                  request may place its first slot (the make-up of
--                  lateness); it does not add to the slack: an idle
--                  schedule grants 1 + slack slots up to now, no more
--          ARGV[6] quota count (0 or absent = no quota)
--          ARGV[7] quota window `per` in microseconds
--          ARGV[8] quota gap in microseconds (>= per): slot j + count is at
--                  least gap after slot j, so no window of `per` holds more
--                  than count departures (the gap adds the margins of
--                  shaper.QuotaMargin and of a slot used late)
--          ARGV[9] make-up owed, microseconds (>= 0, absent = 0): the
--                  intervals of the slots a replica dropped since its last
--                  call because it woke too late for them. It is added to
--                  owed, which never exceeds ARGV[10] (under one interval:
--                  shaper.MakeUpLag), and repaid by spacing the following
--                  slots up to lag (ARGV[5]) closer than interval, as a
--                  lane's own pacer makes up a late departure (SPEC G1: a
--                  waiter that wakes late must not cost rate). A schedule
--                  that fell behind now (idle, a stall beyond the lag) or
--                  that a pause held forgets what it owed (SPEC G2).
--          ARGV[10] the most owed may reach, microseconds (>= 0)
--          ARGV[11] comp at the earliest of those dropped slots (the
--                  seventh value of the answer that granted it, plus what
--                  its lease repaid before it). The make-up is taken only as
--                  far as the make-up repaid after that slot and the make-up
--                  owed stay within ARGV[10] together: then no stretch of
--                  the schedule between two of its slots holds more make-up
--                  than ARGV[10] plus one interval per slot dropped inside
--                  it, which keeps every window of a whole number of
--                  intervals at W × limit + 1 (docs/scaling.md, "Late
--                  wake-ups"). A replica reports its drop after the other
--                  replicas took their next slots: what those slots repaid
--                  is not repaid again.
--          ARGV[12] the most the make-up may space two consecutive slots
--                  closer than interval, microseconds (absent = lag): the
--                  lane's own pacer keeps min_spacing between its
--                  departures with slack 0 (shaper.SlotRepayMax)
--          returns {start, now, pause, granted, remaining, spacing, comp}: the
--          slots are start + i*spacing for i < granted (granted <= k: the
--          quota may cut a lease short; spacing is interval less the
--          make-up repaid per slot, comp the schedule's comp at the first
--          slot); tat advances to start + granted*spacing;
--          remaining is what the quota still allows in the window
--          (now - per, now] after this grant, -1 without a quota.
--          When the quota is spent (the count-th newest grant is gap old
--          only more than an interval after the schedule's slot and now)
--          nothing is granted and the answer is {until, now, pause, 0, 0}:
--          ask again at until, when that grant leaves the window; tat
--          stays, so the wait earns no slots but the slack of an idle
--          schedule (SPEC G2). Within an interval, the slot is granted at
--          that instant instead.
-- pause    ARGV[2] length of the pause from now, microseconds (> 0); the
--          first reserve after it forgets what was owed (SPEC G2)
--          returns {pause, now}
-- release  ARGV[2] a slot's instant in microseconds, ARGV[3] a tolerance
--          in microseconds (half an interval): the newest grant of the
--          quota list within the tolerance of the instant is removed (a
--          slot the replica dropped unused: it no longer counts); tat is
--          not given back. Returns {removed (0 or 1), now}.
-- shift    ARGV[2] a slot's instant in microseconds, ARGV[3] a delay in
--          microseconds (>= 0): a replica's request for that slot reached
--          the wire that much later than the schedule allows. When the
--          schedule goes on after the slot (tat > slot), tat moves later by
--          the delay: the slots not yet granted keep a whole second's
--          distance from that late request where the downstream counts
--          (docs/scaling.md, "Late writes"). Only later, never a burst.
--          Returns {tat, now}.
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
if ARGV[1] == 'release' then
  local x, tol = tonumber(ARGV[2]), tonumber(ARGV[3])
  if not x or not tol or tol < 0 then return redis.error_reply('ERR shaper: bad release arguments') end
  local tail = redis.call('LRANGE', KEYS[2], -16, -1)
  for i = #tail, 1, -1 do
    if math.abs(tonumber(tail[i]) - x) <= tol then
      redis.call('LREM', KEYS[2], -1, tail[i])
      return {'1', string.format('%.0f', now)}
    end
  end
  return {'0', string.format('%.0f', now)}
end
local st = redis.call('HMGET', key, 'tat', 'pause', 'seen', 'owed', 'comp')
local tat = tonumber(st[1]) or 0
local pause = tonumber(st[2]) or 0
local seen = tonumber(st[3]) or 0
local owed = tonumber(st[4]) or 0
local comp = tonumber(st[5]) or 0
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
    'seen', string.format('%.0f', now), 'owed', string.format('%.3f', owed), 'comp', string.format('%.3f', comp))
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

if ARGV[1] == 'shift' then
  local x, d = tonumber(ARGV[2]), tonumber(ARGV[3])
  if not x or not d or d < 0 then return redis.error_reply('ERR shaper: bad shift arguments') end
  if tat > x and d > 0 then
    tat = tat + d
    save()
    keep()
  end
  return {string.format('%.3f', tat), string.format('%.0f', now)}
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
local add = tonumber(ARGV[9] or '0') or 0
local cap = tonumber(ARGV[10] or '0') or 0
local dcomp = tonumber(ARGV[11] or '0') or 0
if add < 0 or cap < 0 then return redis.error_reply('ERR shaper: bad reserve arguments') end
if start > tat then
  owed = 0 -- the schedule fell behind now, or a pause held it: nothing is owed
elseif add > 0 then
  local room = cap - (comp - dcomp) - owed
  if room > 0 then owed = owed + math.min(add, room) end
end
owed = math.min(owed, cap)
-- The make-up repaid per slot of this lease: at most lag, and at most
-- ARGV[12], so consecutive slots stay at least interval - ARGV[12] apart
-- (min_spacing, as the lane's own pacer spaces them).
local repaymax = tonumber(ARGV[12] or '') or lag
if repaymax < 0 then return redis.error_reply('ERR shaper: bad reserve arguments') end
local repay = math.min(owed / k, lag, repaymax)
local sp = iv - repay
local granted = k
local remaining = -1
local qcount = tonumber(ARGV[6] or '0') or 0
local qper = tonumber(ARGV[7] or '0') or 0
local qgap = tonumber(ARGV[8] or '0') or 0
if qcount >= 1 and qper > 0 then
  if qgap < qper then qgap = qper end
  local qkey = KEYS[2]
  -- Grants that bind nothing any more (gap old at start) leave the list,
  -- each once: the list holds the window and its margin only, so that
  -- what remains is counted from the head in a few steps.
  while true do
    local h = redis.call('LINDEX', qkey, 0)
    if not h or tonumber(h) + qgap > start then break end
    redis.call('LPOP', qkey)
  end
  local n = redis.call('LLEN', qkey)
  -- The earliest instant slot j of this lease may have: gap after the
  -- count-th grant before it, in the list followed by this lease's own
  -- slots; nil while fewer than count grants precede it.
  local function bound(j)
    local idx = n + j - qcount
    if idx < 0 then return nil end
    if idx < n then return tonumber(redis.call('LINDEX', qkey, idx)) + qgap end
    return start + (idx - n) * sp + qgap
  end
  local b0 = bound(0)
  if b0 and b0 > start then
    -- Within an interval of the schedule's slot (or of now) the quota only
    -- spaces the slot, as under a backlog each window replays the one
    -- before: grant it there. Later than that it is a wait: no slot (a
    -- slot hours ahead would be held, and lost with its replica).
    if b0 > math.max(now, start) + iv then
      save()
      keep()
      return {string.format('%.3f', b0), string.format('%.0f', now), string.format('%.3f', pause), '0', '0'}
    end
    start = b0
  end
  granted = 1
  while granted < k do
    local b = bound(granted)
    if b and b > start + granted * sp then break end
    granted = granted + 1
  end
  for j = 0, granted - 1 do
    -- Whole microseconds, rounded up (a later instant only makes the quota
    -- stricter): Redis keeps integers in ~10 bytes a grant.
    redis.call('RPUSH', qkey, string.format('%.0f', math.ceil(start + j * sp)))
  end
  redis.call('LTRIM', qkey, -qcount, -1)
  -- The list binds nothing once its newest grant is gap old.
  local life = start + (granted - 1) * sp + qgap - now
  if life < 0 then life = 0 end
  redis.call('PEXPIRE', qkey, string.format('%d', math.floor(life / 1000) + 60000))
  -- What remains: count less the grants in (now - per, now] or later.
  -- The list is in grant order and holds nothing older than gap (plus
  -- the make-up lag), so the grants already out of the window are the
  -- few at its head, within the margin.
  local len = redis.call('LLEN', qkey)
  local out = 0
  while out < len and tonumber(redis.call('LINDEX', qkey, out)) <= now - qper do
    out = out + 1
  end
  remaining = qcount - (len - out)
  if remaining < 0 then remaining = 0 end
end
tat = start + granted * sp
local comp0 = comp
if repay > 0 then
  owed = owed - granted * repay
  if owed < 0 then owed = 0 end
  comp = comp + granted * repay
end
save()
keep()
return {string.format('%.3f', start), string.format('%.0f', now), string.format('%.3f', pause),
  string.format('%d', granted), string.format('%d', remaining), string.format('%.3f', sp),
  string.format('%.3f', comp0)}
