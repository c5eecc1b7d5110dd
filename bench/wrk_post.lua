-- wrk script for make bench-serving-peers (bench/wrk_load.py): POSTs pre-encoded request
-- bodies in turn, one body a line of the file given as the script's first argument
-- (wrk ... -s bench/wrk_post.lua URL -- BODIES_FILE PATH CONTENT_TYPE).
-- Every request is formatted once, in init, so wrk's Lua work per request is one table read.
-- wrk's scripting interface: https://github.com/wg/wrk/blob/master/SCRIPTING

local requests = {}
local n = 0
local i = 0

function init(args)
  local file, path, ctype = args[1], args[2], args[3] or "application/json"
  if file == nil or path == nil then
    error("usage: wrk ... -s wrk_post.lua URL -- BODIES_FILE PATH [CONTENT_TYPE]")
  end
  local f = assert(io.open(file, "rb"))
  for body in f:lines() do
    if #body > 0 then
      n = n + 1
      requests[n] = wrk.format("POST", path, {["Content-Type"] = ctype}, body)
    end
  end
  f:close()
  if n == 0 then
    error(file .. ": no request bodies")
  end
end

function request()
  i = i % n + 1
  return requests[i]
end
