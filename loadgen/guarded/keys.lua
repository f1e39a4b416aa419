-- wrk script of the guarded-service benchmark (run.sh): POST {"item":"book"} with an
-- Idempotency-Key, quoted as the draft writes it.
--
--   wrk ... -s keys.lua URL -- unique TAG   a new key per request: TAG-<thread>-<n>
--   wrk ... -s keys.lua URL -- dup TAG      keys TAG-0 .. TAG-999, in turn (duplicates
--                                           once a warm-up run has completed them)
--
-- At the end it prints one line: RESULT requests=.. seconds=.. p50_us=.. p99_us=..
-- non2xx=.. errors=..

local threads = {}

function setup(thread)
   table.insert(threads, thread)
   thread:set("id", #threads)
end

function init(args)
   mode = args[1] or "unique"
   tag = args[2] or "run"
   n = 0
   body = '{"item":"book"}'
   headers = { ["Content-Type"] = "application/json" }
end

function request()
   n = n + 1
   local key
   if mode == "dup" then
      key = tag .. "-" .. ((n * 7 + id * 500) % 1000)
   else
      key = tag .. "-" .. id .. "-" .. n
   end
   headers["Idempotency-Key"] = '"' .. key .. '"'
   return wrk.format("POST", nil, headers, body)
end

function done(summary, latency, requests)
   local e = summary.errors
   io.write(string.format(
      "RESULT requests=%d seconds=%.3f p50_us=%d p99_us=%d non2xx=%d errors=%d\n",
      summary.requests, summary.duration / 1e6, latency:percentile(50),
      latency:percentile(99), e.status, e.connect + e.read + e.write + e.timeout))
end
