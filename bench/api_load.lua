-- The workloads of bench/api_load.py, for wrk: wrk -s bench/api_load.lua URL -- PLAN MODE THREADS
--   bare:  GET /healthz
--   anonymous: GET /api/v1/workspaces with no credential (401 from the API's own stack)
--   me:    GET /api/v1/me (the cheapest authenticated read: the token's one query)
--   reads: authenticated GETs of workspaces, datasets, jobs and metrics
--   mixed: 80% those reads, 15% audited writes (API tokens made and deleted, access
--          requests made and withdrawn), 5% logins
-- Answers are told apart by their bodies (wrk does not say which request an answer is for).

local threads = {}
local next_tid = 0

function setup(thread)
  thread:set("tid", next_tid)
  next_tid = next_tid + 1
  table.insert(threads, thread)
end

function init(args)
  plan = dofile(args[1])
  mode = args[2]
  local nthreads = tonumber(args[3])
  counts = {}
  tokens = {} -- API tokens made here and not yet deleted: {id, user}
  free = {} -- (user, dataset) pairs of this thread with no live access request
  pending = {} -- {id, pair} of requests made here and not yet withdrawn
  for i, pair in ipairs(plan.pairs) do
    if (i - 1) % nthreads == tid then
      table.insert(free, pair)
    end
  end
  made = 0
  unexpected = {} -- a few bodies of answers the workload never provokes, for the report
  math.randomseed(os.time() + tid * 7919)
end

local function auth(user, json)
  local headers = { Authorization = "Bearer " .. user.token }
  if json then
    headers["Content-Type"] = "application/json"
  end
  return headers
end

local function read_request()
  local user = plan.users[math.random(#plan.users)]
  local r = math.random(4)
  local path
  if r == 1 then
    path = "/api/v1/workspaces"
  elseif r == 2 then
    path = "/api/v1/workspaces/" .. user.ws .. "/datasets"
  elseif r == 3 then
    path = "/api/v1/workspaces/" .. user.ws .. "/jobs"
  else
    path = "/api/v1/jobs/" .. user.job .. "/metrics"
  end
  return wrk.format("GET", path, auth(user))
end

local function token_request()
  if #tokens > 0 and math.random() < 0.5 then
    local t = table.remove(tokens, math.random(#tokens))
    return wrk.format("DELETE", "/api/v1/me/tokens/" .. t.id, auth(plan.users[t.user]))
  end
  local u = math.random(#plan.users)
  made = made + 1
  local body = string.format('{"name":"u%d-%d-%d","expires_in_days":1}', u, tid, made)
  return wrk.format("POST", "/api/v1/me/tokens", auth(plan.users[u], true), body)
end

local function access_request()
  if #pending > 0 and (#free == 0 or math.random() < 0.5) then
    local p = table.remove(pending, math.random(#pending))
    local path = "/api/v1/access-requests/" .. p.id .. "/withdraw"
    return wrk.format("POST", path, auth(plan.users[p.pair.user]))
  end
  if #free == 0 then
    return token_request()
  end
  local pair = table.remove(free, math.random(#free))
  local body = string.format('{"dataset_id":"%s","purpose":"bench"}', pair.dataset)
  return wrk.format("POST", "/api/v1/access-requests", auth(plan.users[pair.user], true), body)
end

local function login_request()
  local user = plan.users[math.random(#plan.users)]
  local body = string.format('{"email":"%s","password":"%s"}', user.email, plan.password)
  return wrk.format("POST", "/api/v1/auth/login", { ["Content-Type"] = "application/json" }, body)
end

function request()
  if mode == "bare" then
    return wrk.format("GET", "/healthz")
  end
  if mode == "anonymous" then
    return wrk.format("GET", "/api/v1/workspaces")
  end
  if mode == "me" then
    return wrk.format("GET", "/api/v1/me", auth(plan.users[math.random(#plan.users)]))
  end
  if mode == "reads" then
    return read_request()
  end
  local x = math.random()
  if x < 0.80 then
    return read_request()
  elseif x < 0.875 then
    return token_request()
  elseif x < 0.95 then
    return access_request()
  end
  return login_request()
end

local function classify(status, body)
  if status == 204 then
    return "token.delete"
  elseif body:find('"token":"nbt_', 1, true) then
    local id = body:match('"id":"([%w%-]+)"')
    local user = tonumber(body:match('"name":"u(%d+)%-'))
    if id and user then
      table.insert(tokens, { id = id, user = user })
    end
    return "token.create"
  elseif body:find('"token":"nbs_', 1, true) then
    return "login"
  elseif body:find('"status":"pending"', 1, true) or body:find('"status":"withdrawn"', 1, true) then
    local requester = body:match('"requester_id":"([%w%-]+)"')
    local dataset = body:match('"dataset_id":"([%w%-]+)"')
    local pair = { user = plan.user_index[requester], dataset = dataset }
    if body:find('"status":"pending"', 1, true) then
      table.insert(pending, { id = body:match('"id":"([%w%-]+)"'), pair = pair })
      return "access.create"
    end
    table.insert(free, pair)
    return "access.withdraw"
  elseif body:find('"series":', 1, true) then
    return "read"
  elseif body:find('"items":', 1, true) then
    return "read"
  elseif body:find('"status":"ok"', 1, true) then
    return "bare"
  elseif body:find("password checks", 1, true) then
    return "login"
  elseif status == 401 and mode == "anonymous" then
    return "anonymous"
  elseif body:find('"display_name":', 1, true) then
    return "me"
  end
  return "other"
end

function response(status, headers, body)
  local kind = classify(status, body)
  local key = kind .. " " .. status
  counts[key] = (counts[key] or 0) + 1
  if kind == "other" and #unexpected < 3 then
    table.insert(unexpected, status .. " " .. body:sub(1, 160):gsub('[%c"\\]', " "))
  end
end

function done(summary, latency, requests)
  local merged = {}
  local bodies = {}
  for _, thread in ipairs(threads) do
    local c = thread:get("counts")
    for key, n in pairs(c) do
      merged[key] = (merged[key] or 0) + n
    end
    for _, body in ipairs(thread:get("unexpected")) do
      table.insert(bodies, '"' .. body .. '"')
    end
  end
  local parts = {}
  for key, n in pairs(merged) do
    table.insert(parts, string.format('"%s":%d', key, n))
  end
  local e = summary.errors
  io.write(string.format(
    'JSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"connect":%d,"read":%d,'
      .. '"write":%d,"timeout":%d,"status":%d,"counts":{%s},"unexpected":[%s]}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.timeout, e.status, table.concat(parts, ","),
    table.concat(bodies, ",")
  ))
end
