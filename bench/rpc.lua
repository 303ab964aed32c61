-- wrk script for bench/rpc.sh: alternates aria2.tellActive (the keys a front-end polls) and aria2.getGlobalStat,
-- both with the token from $TOKEN; counts answers that are not HTTP 200 with a "result" as errors.
local token = os.getenv("TOKEN") or ""
local bodies = {
    '{"jsonrpc":"2.0","id":1,"method":"aria2.tellActive","params":["token:' .. token
        .. '",["gid","status","totalLength","completedLength","downloadSpeed","connections"]]}',
    '{"jsonrpc":"2.0","id":2,"method":"aria2.getGlobalStat","params":["token:' .. token .. '"]}',
}
local headers = { ["Content-Type"] = "application/json" }
-- DELAY_MS > 0: each connection waits that long before each request (a fixed offered load, about
-- connections * 1000 / (DELAY_MS + latency) requests per second) instead of sending the next at once (flat out).
local pause = tonumber(os.getenv("DELAY_MS") or "0")
if pause > 0 then
    function delay()
        return pause
    end
end
local threads = {}

function setup(thread)
    table.insert(threads, thread)
end

function init(args)
    counter = 0
    errors = 0
end

function request()
    counter = counter + 1
    return wrk.format("POST", "/jsonrpc", headers, bodies[counter % 2 + 1])
end

function response(status, headers, body)
    if status ~= 200 or not string.find(body, '"result"', 1, true) then
        errors = errors + 1
    end
end

function done(summary, latency, requests)
    local failed = 0
    for _, thread in ipairs(threads) do
        failed = failed + thread:get("errors")
    end
    local e = summary.errors
    io.write(string.format("RESULT rps=%.1f p50=%.3f p99=%.3f errors=%d socket_errors=%d\n",
        summary.requests / (summary.duration / 1e6), latency:percentile(50) / 1000, latency:percentile(99) / 1000,
        failed, e.connect + e.read + e.write + e.timeout + e.status))
end
