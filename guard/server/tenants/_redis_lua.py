"""The one server-side script that changes a tenant's budget state in Redis.

It mirrors, operation by operation and in the same float arithmetic, the in-memory
``guard.policy.RollingWindow`` / ``TenantBudget`` / ``TenantAllowances`` (their docstrings
give the semantics; ``tests/redisstate/test_equivalence.py`` holds the two equal). Every
operation of one tenant is one call of this script, so it is atomic across replicas: a
window's reset (eviction of the buckets that slid out) happens in the same script as the
increment, and a key that does not exist yet is created by the script with its first value
(never seeded with INCR by each caller).

KEYS (all share the tenant's hash tag, so one script's keys live in one cluster slot):
  1 agg    hash  o1 o2 (outstanding grants cost_usd/tokens), live (live grant entries),
                 r1 r2 (last need refused)
  2 slots  zset  run_id -> lease expiry (concurrency slots)
  3 grants hash  run_id -> "seen1 seen2 ceil1 ceil2 L|T" (L = live, T = ended, its tail)
  4 exp    zset  run_id -> when its grant entry is dropped (lease expiry, or tail expiry)
  5..      hash  one per rolling limit: h (newest bucket id), s (running sum),
                 <bucket id> -> sum of that bucket
ARGV: op, now ('' = Redis TIME), nwin, nwin x (metric, limit, window_s), buckets,
  max_concurrent_runs ('' = none), lease_s, tail_s, keep_ms, then the op's own.
Numbers go back as strings (Lua numbers would be truncated to integers by Redis).
"""

from __future__ import annotations

__all__ = ["TENANT_LUA"]

TENANT_LUA = r"""
if redis.replicate_commands then pcall(redis.replicate_commands) end
local CAP, EPS = 1e300, 1e-12
local function fmt(x) return string.format('%.17g', x) end
local function sat(x) if x > CAP then return CAP elseif x < -CAP then return -CAP end return x end
local op = ARGV[1]
local now
if ARGV[2] == '' then
  local t = redis.call('TIME'); now = tonumber(t[1]) + tonumber(t[2]) / 1e6
else now = tonumber(ARGV[2]) end
local nwin = tonumber(ARGV[3])
local W, p = {}, 4
for i = 1, nwin do
  W[i] = {key = KEYS[4 + i], metric = ARGV[p], limit = tonumber(ARGV[p + 1]),
          window_s = tonumber(ARGV[p + 2])}
  p = p + 3
end
local buckets = tonumber(ARGV[p])
local cap = tonumber(ARGV[p + 1])
local lease_s, tail_s = tonumber(ARGV[p + 2]), tonumber(ARGV[p + 3])
local keep_ms = tonumber(ARGV[p + 4])
p = p + 5
local AGG, SLOTS, GRANTS, EXP = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

-- windows -------------------------------------------------------------------------------
local function bucket_sum(w)
  local all, s = redis.call('HGETALL', w.key), 0
  for i = 1, #all, 2 do
    if all[i] ~= 'h' and all[i] ~= 's' then s = s + tonumber(all[i + 1]) end
  end
  return s
end
local function advance(w)
  if not w.loaded then
    local r = redis.call('HMGET', w.key, 'h', 's')
    w.h, w.s, w.loaded, w.width = tonumber(r[1]), tonumber(r[2]) or 0, true, w.window_s / buckets
  end
  local b = math.floor(now / w.width)
  if w.h == nil then w.h, w.dirty, w.moved = b, true, true; return b end
  if b <= w.h then return w.h end
  if b - w.h >= buckets then
    redis.call('DEL', w.key); w.s = 0
  else
    local names = {}
    for k = w.h + 1 - buckets, b - buckets do names[#names + 1] = fmt(k) end
    local vals = redis.call('HMGET', w.key, unpack(names))
    local gone = {}
    for j = 1, #names do
      if vals[j] then w.s = w.s - tonumber(vals[j]); gone[#gone + 1] = names[j] end
    end
    if #gone > 0 then redis.call('HDEL', w.key, unpack(gone)) end
  end
  w.h, w.dirty, w.moved = b, true, true
  -- float subtraction drift: when every bucket is empty the sum is exactly zero
  if math.abs(w.s) < 1e-9 then w.s = bucket_sum(w) end
  return b
end
local function add(w, value)
  local head = advance(w)
  local b = math.min(math.floor(now / w.width), head)
  if head - b >= buckets then return end
  local f = fmt(b)
  local new = (tonumber(redis.call('HGET', w.key, f)) or 0) + value
  if -CAP <= new and new <= CAP and -CAP <= w.s + value and w.s + value <= CAP then
    w.s = w.s + value
    w.pend = {f, fmt(new)}  -- written with h and s at the end
  else
    w.pend = nil
    redis.call('HSET', w.key, f, fmt(sat(new)))
    w.s = sat(bucket_sum(w))
  end
  w.dirty = true
end
local function total(w) advance(w); return w.s end
local function exhausted()
  for i = 1, nwin do
    local w = W[i]
    local used = total(w)
    if used >= w.limit - 1e-9 * math.max(1.0, w.limit) then return {i, used, w.limit} end
  end
  return nil
end
local AM = {cost_usd = 1, tokens = 2}
local function headroom()
  local out = {}
  for i = 1, nwin do
    local j = AM[W[i].metric]
    if j then
      local left = math.max(0.0, W[i].limit - total(W[i]))
      if out[j] == nil then out[j] = left else out[j] = math.min(out[j], left) end
    end
  end
  return out
end

-- grants ----------------------------------------------------------------------------------
local A
local function agg()
  if not A then
    local r = redis.call('HMGET', AGG, 'o1', 'o2', 'live', 'r1', 'r2')
    A = {o = {tonumber(r[1]) or 0, tonumber(r[2]) or 0}, live = tonumber(r[3]) or 0,
         r = {tonumber(r[4]) or 0, tonumber(r[5]) or 0}}
  end
  return A
end
local function parse(v)
  if not v then return nil end
  local f = {}
  for x in string.gmatch(v, '%S+') do f[#f + 1] = x end
  return {seen = {tonumber(f[1]), tonumber(f[2])}, ceil = {tonumber(f[3]), tonumber(f[4])},
          tail = f[5] == 'T'}
end
local function entry(rid) return parse(redis.call('HGET', GRANTS, rid)) end
local function pack(e)
  return fmt(e.seen[1]) .. ' ' .. fmt(e.seen[2]) .. ' ' .. fmt(e.ceil[1]) .. ' ' ..
    fmt(e.ceil[2]) .. (e.tail and ' T' or ' L')
end
local function put(rid, e) redis.call('HSET', GRANTS, rid, pack(e)) end
local function outst(e, i) return math.max(0.0, e.ceil[i] - e.seen[i]) end
local function drop(rid, e)
  local a = agg(); a.dirty = true
  redis.call('HDEL', GRANTS, rid); redis.call('ZREM', EXP, rid)
  if not e.tail then a.live = a.live - 1 end
  for i = 1, 2 do a.o[i] = math.max(0.0, a.o[i] - outst(e, i)) end
end
local function set_seen(e, v, cumulative)
  local a = agg(); a.dirty = true
  for i = 1, 2 do
    local before = outst(e, i)
    if cumulative then e.seen[i] = math.max(e.seen[i], v[i]) else e.seen[i] = e.seen[i] + v[i] end
    a.o[i] = a.o[i] + outst(e, i) - before
    if math.abs(a.o[i]) < 1e-9 then a.o[i] = math.max(0.0, a.o[i]) end
  end
end
local function expire()
  local gone = redis.call('ZRANGEBYSCORE', EXP, '-inf', fmt(now))
  for _, rid in ipairs(gone) do
    local e = entry(rid)
    if e then drop(rid, e) else redis.call('ZREM', EXP, rid) end
  end
end
local function all_settled(e) return outst(e, 1) <= EPS and outst(e, 2) <= EPS end
local function release(rid, final)
  local e = entry(rid)
  if e == nil or e.tail then return end
  if final == nil then drop(rid, e); return end
  local a = agg(); a.dirty = true
  for i = 1, 2 do
    local before = outst(e, i)
    e.ceil[i] = math.min(e.ceil[i], math.max(e.seen[i], final[i]))
    a.o[i] = a.o[i] + outst(e, i) - before
  end
  if all_settled(e) then drop(rid, e); return end
  e.tail = true; a.live = a.live - 1
  put(rid, e); redis.call('ZADD', EXP, fmt(now + tail_s), rid)
end
local function ceilings(e) return {'g', fmt(e.ceil[1]), fmt(e.ceil[2])} end
local function grant(rid, need, seen)
  expire()
  local a = agg(); a.dirty = true
  local e = entry(rid)
  if e == nil then
    e = {seen = {seen[1], seen[2]}, ceil = {seen[1], seen[2]}, tail = false}
    a.live = a.live + 1
    put(rid, e)
  end
  if e.tail then return ceilings(e) end
  redis.call('ZADD', EXP, fmt(now + lease_s), rid)  -- it asked: it is alive
  local head = headroom()
  local limits = {math.huge, math.huge}
  for i = 1, nwin do
    local j = AM[W[i].metric]
    if j then limits[j] = math.min(limits[j], W[i].limit) end
  end
  for i = 1, 2 do
    local h = head[i]
    if h ~= nil then
      local available = math.max(0.0, h - a.o[i])
      if need[i] > available + EPS then
        a.r[i] = need[i]
        local r = ceilings(e)
        r[1] = 'x'
        for _, x in ipairs({i, need[i], available, limits[i], limits[i] - h, a.o[i]}) do
          r[#r + 1] = fmt(x)
        end
        return r
      end
    end
  end
  for i = 1, 2 do  -- exactly the need: nothing is granted ahead of a call
    local h = head[i]
    if h ~= nil and need[i] > 0.0 then
      local add = math.min(need[i], math.max(0.0, h - a.o[i]))
      local before = outst(e, i)
      e.ceil[i] = math.max(e.ceil[i], e.seen[i]) + add
      a.o[i] = a.o[i] + outst(e, i) - before
    end
  end
  put(rid, e)
  return ceilings(e)
end

-- operations ------------------------------------------------------------------------------
local function hit_reply(h) return {'w', fmt(h[1]), fmt(h[2]), fmt(h[3])} end
local function run_windows_add(n)
  for i = 1, nwin do if W[i].metric == 'runs' then add(W[i], n) end end
end
local reply = {'ok'}
if op == 'admit' then
  local rid = ARGV[p]
  redis.call('ZREMRANGEBYSCORE', SLOTS, '-inf', fmt(now))  -- lease over: slot gone
  if redis.call('ZSCORE', SLOTS, rid) then
    redis.call('ZADD', SLOTS, fmt(now + lease_s), rid)  -- re-registered: it holds its slot
    reply = {'ok', 'kept'}  -- (so a registration of it that makes no run frees nothing)
  else
    local live_runs = redis.call('ZCARD', SLOTS)
    local h = exhausted()
    if cap and live_runs >= cap then reply = {'c', fmt(live_runs), fmt(cap)}
    elseif h then reply = hit_reply(h)
    else
      local head = headroom()
      local a = agg()
      for j = 1, 2 do
        local need = a.r[j]
        if head[j] ~= nil and need ~= 0 and reply[1] == 'ok' then
          local left = math.max(0.0, head[j] - a.o[j])
          if left + EPS < need then reply = {'s', fmt(j), fmt(left), fmt(need), fmt(a.o[j])} end
        end
      end
      if reply[1] == 'ok' then
        run_windows_add(1.0)
        redis.call('ZADD', SLOTS, fmt(now + lease_s), rid)
      end
    end
  end
elseif op == 'record' then
  for i = 1, nwin do
    local v = tonumber(ARGV[p + ({cost_usd = 0, tokens = 1, input_tokens = 2, output_tokens = 3,
                                  steps = 4, tool_calls = 5, runs = 6})[W[i].metric]])
    if v ~= 0 then add(W[i], v) end
  end
  p = p + 7
  local nobs = tonumber(ARGV[p]); p = p + 1
  if nobs > 0 then  -- one read and one write of the grants for all the touched runs
    local rids = {}
    for k = 1, nobs do rids[k] = ARGV[p + 3 * (k - 1)] end
    local vals, got, changed = redis.call('HMGET', GRANTS, unpack(rids)), {}, {}
    for k = 1, nobs do
      local rid = rids[k]
      local e = got[rid]  -- a run named twice in one request is one entry
      if e == nil then e = parse(vals[k]) or false; got[rid] = e end
      if e then
        local s1, s2 = e.seen[1], e.seen[2]
        set_seen(e, {tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])}, true)
        if e.seen[1] ~= s1 or e.seen[2] ~= s2 then changed[rid] = e end
      end
      p = p + 3
    end
    local flat = {}
    for rid, e in pairs(changed) do flat[#flat + 1] = rid; flat[#flat + 1] = pack(e) end
    if #flat > 0 then redis.call('HSET', GRANTS, unpack(flat)) end
  end
  local nlate = tonumber(ARGV[p]); p = p + 1
  for _ = 1, nlate do
    local e = entry(ARGV[p])
    if e then
      set_seen(e, {tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])}, false)
      if all_settled(e) then drop(ARGV[p], e) else put(ARGV[p], e) end
    end
    p = p + 3
  end
  local h = exhausted()
  if h then reply = hit_reply(h) end
  -- the fleet's sums after this request: the replica's view until its next request
  for i = 1, nwin do reply[#reply + 1] = fmt(total(W[i])) end
elseif op == 'grant' then
  reply = grant(ARGV[p], {tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])},
                {tonumber(ARGV[p + 3]), tonumber(ARGV[p + 4])})
elseif op == 'grant_of' then
  local e = entry(ARGV[p])
  if e then reply = ceilings(e) else reply = {'none'} end
elseif op == 'end' then
  local rid, free_slot, mode = ARGV[p], ARGV[p + 1] == '1', ARGV[p + 2]
  if free_slot then redis.call('ZREM', SLOTS, rid) end
  if mode ~= '-' then
    local e = entry(rid)
    if e and ARGV[p + 3] ~= '' then  -- what it spent, before the rest goes back
      set_seen(e, {tonumber(ARGV[p + 3]), tonumber(ARGV[p + 4])}, true); put(rid, e)
    end
    if mode == 'final' then release(rid, {tonumber(ARGV[p + 5]), tonumber(ARGV[p + 6])})
    else release(rid, nil) end
  end
elseif op == 'expire' then
  expire()
elseif op == 'heartbeat' then
  local claim = ARGV[p] == '1'
  local n = tonumber(ARGV[p + 1])
  for k = 1, n do
    local rid = ARGV[p + 1 + k]
    if claim then redis.call('ZADD', SLOTS, fmt(now + lease_s), rid)
    else redis.call('ZADD', SLOTS, 'XX', fmt(now + lease_s), rid) end
    local e = entry(rid)
    if e and not e.tail then redis.call('ZADD', EXP, fmt(now + lease_s), rid) end
  end
elseif op == 'status' then
  local live_runs = redis.call('ZCOUNT', SLOTS, '(' .. fmt(now), '+inf')
  local a = agg()
  reply = {'st', fmt(live_runs), fmt(a.o[1]), fmt(a.o[2])}
  for i = 1, nwin do reply[#reply + 1] = fmt(total(W[i])) end
  local h = exhausted()
  if h then reply[#reply + 1] = fmt(h[1]) end
else
  return redis.error_reply('otel-guard: unknown op ' .. tostring(op))
end

-- write back ------------------------------------------------------------------------------
for i = 1, nwin do
  local w = W[i]
  if w.dirty then
    if w.pend then redis.call('HSET', w.key, 'h', fmt(w.h), 's', fmt(w.s), w.pend[1], w.pend[2])
    else redis.call('HSET', w.key, 'h', fmt(w.h), 's', fmt(w.s)) end
    -- every bucket written since the head last moved is out of the window within
    -- window_s of that move: refreshing the TTL then is enough
    if w.moved then redis.call('PEXPIRE', w.key, math.ceil(w.window_s * 1000) + 1000) end
  end
end
if A and A.dirty then
  redis.call('HSET', AGG, 'o1', fmt(A.o[1]), 'o2', fmt(A.o[2]), 'live', fmt(A.live),
             'r1', fmt(A.r[1]), 'r2', fmt(A.r[2]))
end
-- the state keys' TTL moves with every operation on runs (a record only changes keys that
-- exist and that the runs' heartbeats keep alive)
if op ~= 'status' and op ~= 'grant_of' and op ~= 'record' then
  for k = 1, 4 do redis.call('PEXPIRE', KEYS[k], keep_ms) end
end
return reply
"""
