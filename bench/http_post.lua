-- wrk script of bench/http.py: POST admissions with distinct dedupe keys.
-- Environment: BENCH_PATH (the route), BENCH_ENDPOINT, BENCH_API_KEY (may be
-- empty), BENCH_KEY_PREFIX (unique per run and phase). The body is the same
-- shape for every route, so the routes differ only in what they do with it.
-- done() prints one line "BENCH_RESULT {json}" that bench/http.py parses.

local threads = {}

function setup(thread)
  thread:set("thread_no", #threads + 1)
  table.insert(threads, thread)
end

local counter = 0
local path, endpoint, prefix

function init(args)
  path = os.getenv("BENCH_PATH")
  endpoint = os.getenv("BENCH_ENDPOINT")
  prefix = os.getenv("BENCH_KEY_PREFIX") .. "-" .. thread_no
  local key = os.getenv("BENCH_API_KEY") or ""
  wrk.headers["Content-Type"] = "application/json"
  if key ~= "" then
    wrk.headers["Authorization"] = "Bearer " .. key
  end
end

function request()
  counter = counter + 1
  local k = prefix .. "-" .. counter
  local body = string.format(
    '{"endpoint":"%s","dedupe_key":"%s","input":{"key":"%s","text":"benchmark admission"}}',
    endpoint, k, k)
  return wrk.format("POST", path, nil, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"requests":%d,"duration_us":%d,"errors":{"connect":%d,"read":%d,' ..
    '"write":%d,"status":%d,"timeout":%d},"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
end
