#!lua name=leasefence

-- leasefence fenced commands for Redis 7+ (Functions). Library version 5.
--
-- Every fenced function takes
--   KEYS[1] = the fence key 'leasefence:fence:{RESOURCE}' (the braces make the
--             resource a cluster hash tag: put '{RESOURCE}' in your data keys too)
--   ARGV[1] = the token, decimal, 1..18446744073709551615 (compared as decimal
--             strings, exact for every u64: Lua numbers are doubles)
--   ARGV[2] = 'strict' (last < token) or 'monotonic' (last <= token),
--             optionally followed by one space and the fence's signature
--             ('strict v1.<key id>.<64 hex>', see "Signed fences" below)
-- A stale call changes nothing and fails with
--   -STALE <presented> <current> <resource>
-- Invalid arguments fail with -LFINVALID <reason>, and so does a call whose
-- command would write any key under the fence-key prefix 'leasefence:fence:'
-- as data: its own fence key (the effect and the token would overwrite each
-- other) or another resource's (a holder of 'a' could reset the fence of 'b'
-- and let b's stale writers through; in a cluster, the fence key of 'b}x'
-- shares the slot of b's). Every fence key starts with the prefix, so keys
-- that only contain it later on are ordinary keys.
--
-- A call whose command writes nothing records no fence: XADD ... NOMKSTREAM
-- on a missing stream replies nil and leaves the token unused. SET's NX, XX
-- and GET are refused instead (see SET_EXPIRY). DEL records the token even
-- when no key existed: its effect is that the keys are absent, which a stale
-- SET must not undo.
--
-- Signed fences (version 5): when the library is loaded with verifying keys
-- (at most two: a rotation; the Rust installer writes them into FENCE_KEYS
-- below, see `redis::Via::add_fence_key`), every fenced call must carry a
-- signature, the coordinator's HMAC-SHA256 over 'leasefence-fence-v1' LF key
-- id LF resource LF token under one of them, or fails, changing nothing, with
--   -BADSIG <missing|malformed|unknown_key|mismatch> <key id or -> <resource>
-- SHA-256 is computed here with the bit library (Redis Lua has no other hash
-- than SHA-1). The keys live in the library's code, not in a key: no extra
-- read per call, nothing in another cluster slot, persisted and replicated
-- with the library; `FUNCTION LIST WITHCODE` shows them, so keep that
-- command (and FUNCTION DUMP) from the users that run effects.
--
-- Order inside a call: check the signature, read and check the fence, apply the command, then record
-- the token. If the command itself fails (WRONGTYPE, a bad stream ID) the call
-- aborts before the fence is written, so the command and the fence happen
-- together or not at all. Functions run atomically. leasefence_set writes the
-- value and the token with one MSET (SET cannot fail on a key's type).
--
-- Cost: every C function called from Lua (string.find, redis.call, ...) costs
-- server time on every fenced call, so the checks use one string.find each and
-- leasefence_set makes two redis.call (version 1 made three, with more string
-- work: 2.3-2.5 µs of server time per fenced SET in INFO commandstats, version
-- 2 about 1.95 µs, against 0.15 µs for a plain SET).

local VERSION = '5'
local FENCE_PREFIX = 'leasefence:fence:'
-- Key id -> 32-byte secret in hex; empty: fences are not checked. The next
-- line is rewritten by the installer and must stay one line.
local FENCE_KEYS = {} -- leasefence:fence-keys
local U64_MAX = '18446744073709551615'

-- A canonical u64 decimal: no sign, no leading zero, at most U64_MAX.
local function valid_token(s)
    local n = #s
    if n > 20 or not string.find(s, '^[1-9]%d*$') then
        return false
    end
    return n < 20 or s <= U64_MAX
end

local function invalid(reason)
    return redis.error_reply('LFINVALID ' .. reason)
end

-- SHA-256 (FIPS 180-4) on 32-bit words held as Lua numbers: every sum is
-- brought back into range with bit.tobit, which wraps modulo 2^32. (The bit
-- library is there when a function runs, not while the library loads.)
local K256 = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

-- Runs the compression function over the 64-byte blocks of `msg` (whose
-- length is a multiple of 64) on the state `h` (8 words), in place.
local function compress(h, msg)
    local band, bor, bxor = bit.band, bit.bor, bit.bxor
    local ror, rshift, lshift, tobit = bit.ror, bit.rshift, bit.lshift, bit.tobit
    local byte = string.byte
    local w = {}
    for chunk = 1, #msg, 64 do
        for i = 0, 15 do
            local a, b, c, d = byte(msg, chunk + i * 4, chunk + i * 4 + 3)
            w[i] = bor(lshift(a, 24), lshift(b, 16), lshift(c, 8), d)
        end
        for i = 16, 63 do
            local x, y = w[i - 15], w[i - 2]
            local s0 = bxor(ror(x, 7), ror(x, 18), rshift(x, 3))
            local s1 = bxor(ror(y, 17), ror(y, 19), rshift(y, 10))
            w[i] = tobit(w[i - 16] + s0 + w[i - 7] + s1)
        end
        local a, b, c, d, e, f, g, hh = h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8]
        for i = 0, 63 do
            -- ch = g ^ (e & (f ^ g)), maj = (a & b) | (c & (a | b)): fewer calls.
            local t1 = hh + bxor(ror(e, 6), ror(e, 11), ror(e, 25)) + bxor(g, band(e, bxor(f, g)))
                + K256[i + 1] + w[i]
            local t2 = bxor(ror(a, 2), ror(a, 13), ror(a, 22)) + bor(band(a, b), band(c, bor(a, b)))
            hh, g, f, e = g, f, e, tobit(d + t1)
            d, c, b, a = c, b, a, tobit(t1 + t2)
        end
        h[1], h[2], h[3], h[4] = tobit(h[1] + a), tobit(h[2] + b), tobit(h[3] + c), tobit(h[4] + d)
        h[5], h[6], h[7], h[8] = tobit(h[5] + e), tobit(h[6] + f), tobit(h[7] + g), tobit(h[8] + hh)
    end
end

local SHA256_INIT = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 }

-- SHA-256 of `prefix_len` bytes already compressed into the state `h` (a
-- copy is made) followed by `msg`: the final state.
local function sha256_continue(h, prefix_len, msg)
    local state = { h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8] }
    local bits = (prefix_len + #msg) * 8
    local pad = (55 - #msg) % 64
    compress(state, msg .. '\128' .. string.rep('\0', pad)
        .. string.char(0, 0, 0, math.floor(bits / 2^32) % 256,
                       math.floor(bits / 2^24) % 256, math.floor(bits / 2^16) % 256,
                       math.floor(bits / 2^8) % 256, bits % 256))
    return state
end

local function state_bytes(state)
    local band, rshift = bit.band, bit.rshift
    local out = {}
    for i = 1, 8 do
        local v = state[i]
        out[i] = string.char(band(rshift(v, 24), 255), band(rshift(v, 16), 255), band(rshift(v, 8), 255), band(v, 255))
    end
    return table.concat(out)
end

-- The states after the HMAC's first block (key ^ ipad, key ^ opad), per
-- secret: they depend on the key alone, so each call compresses two blocks
-- fewer. A cache only (what it holds follows from the keys hash); reset when
-- it grows past a few secrets, as when keys are replaced many times.
local PADS = { n = 0 }

local function pads(secret_hex)
    local cached = PADS[secret_hex]
    if cached then return cached end
    local bxor = bit.bxor
    local ipad, opad = {}, {}
    for i = 1, 64 do
        local k = i <= 32 and tonumber(string.sub(secret_hex, 2 * i - 1, 2 * i), 16) or 0
        ipad[i] = string.char(bxor(k, 0x36))
        opad[i] = string.char(bxor(k, 0x5c))
    end
    local inner, outer = { unpack(SHA256_INIT) }, { unpack(SHA256_INIT) }
    compress(inner, table.concat(ipad))
    compress(outer, table.concat(opad))
    if PADS.n >= 8 then
        PADS = { n = 0 }
    end
    cached = { inner, outer }
    PADS[secret_hex] = cached
    PADS.n = PADS.n + 1
    return cached
end

-- HMAC-SHA256 (RFC 2104) of `msg` under the 32-byte secret given as 64 hex
-- digits: its eight 32-bit words.
local function hmac_sha256(secret_hex, msg)
    local p = pads(secret_hex)
    return sha256_continue(p[2], 64, state_bytes(sha256_continue(p[1], 64, msg)))
end

-- The same, in lowercase hex.
local function hmac_sha256_hex(secret_hex, msg)
    local mac = hmac_sha256(secret_hex, msg)
    local tohex = bit.tohex
    return tohex(mac[1]) .. tohex(mac[2]) .. tohex(mac[3]) .. tohex(mac[4])
        .. tohex(mac[5]) .. tohex(mac[6]) .. tohex(mac[7]) .. tohex(mac[8])
end

-- Whether `mac_hex` (64 hex digits, checked by the caller) is the HMAC
-- `mac`, in time that does not depend on where they differ: every word is
-- compared, and no string is made of the secret MAC (Lua interns strings,
-- and interning compares bytes with those already held).
local function mac_equal(mac, mac_hex)
    local bor, bxor = bit.bor, bit.bxor
    local diff = 0
    for i = 1, 8 do
        diff = bor(diff, bxor(mac[i], tonumber(string.sub(mac_hex, 8 * i - 7, 8 * i), 16)))
    end
    return diff == 0
end

local function bad_signature(reason, key_id, resource)
    return redis.error_reply('BADSIG ' .. reason .. ' ' .. key_id .. ' ' .. resource)
end

-- Nil when the signature admits the fence (or no key is installed), else
-- the -BADSIG reply. `signature` is nil when the call carried none.
local function check_signature(resource, token, signature)
    if next(FENCE_KEYS) == nil then
        return nil
    end
    if not signature then
        return bad_signature('missing', '-', resource)
    end
    local key_id, mac = string.match(signature, '^v1%.([a-z0-9_%-]+)%.([0-9a-f]+)$')
    if not key_id or #key_id > 32 or #mac ~= 64 then
        return bad_signature('malformed', '-', resource)
    end
    local secret = FENCE_KEYS[key_id]
    if not secret then
        return bad_signature('unknown_key', key_id, resource)
    end
    local message = 'leasefence-fence-v1\n' .. key_id .. '\n' .. resource .. '\n' .. token
    if not mac_equal(hmac_sha256(secret, message), mac) then
        return bad_signature('mismatch', key_id, resource)
    end
    return nil
end

-- Returns an error reply when the call must not proceed, nil when admitted.
-- The caller has checked how many keys and arguments it got.
local function check(keys, args)
    local fence_key, token, mode = keys[1], args[1], args[2]
    local signature
    local space = string.find(mode, ' ', 1, true)
    if space then
        mode, signature = string.sub(mode, 1, space - 1), string.sub(mode, space + 1)
    end
    if not string.find(fence_key, '^leasefence:fence:{.+}$') then
        return invalid('KEYS[1] must be the fence key leasefence:fence:{RESOURCE}')
    end
    if not valid_token(token) then
        return invalid('token must be a decimal integer in 1..' .. U64_MAX)
    end
    local strict = mode == 'strict'
    if not strict and mode ~= 'monotonic' then
        return invalid("mode must be 'strict' or 'monotonic'")
    end
    for i = 2, #keys do
        if string.sub(keys[i], 1, 17) == FENCE_PREFIX then
            return invalid('data keys must not start with ' .. FENCE_PREFIX .. ' (the prefix of fence keys)')
        end
    end
    -- The resource is the text between 'leasefence:fence:{' and '}'.
    local resource = string.sub(fence_key, 19, -2)
    local refused = check_signature(resource, token, signature)
    if refused then return refused end
    local current = redis.call('GET', fence_key)
    if current then
        if not valid_token(current) then
            return redis.error_reply('LFCORRUPT fence key ' .. fence_key .. ' holds a non-token value')
        end
        -- Canonical decimals order by length, then as strings.
        local nc, nt = #current, #token
        local ok
        if nc ~= nt then
            ok = nc < nt
        elseif strict then
            ok = current < token
        else
            ok = current <= token
        end
        if not ok then
            return redis.error_reply('STALE ' .. token .. ' ' .. current .. ' ' .. resource)
        end
    end
    return nil
end

-- The expiry options a fenced SET accepts, and whether each takes a number.
-- NX, XX and GET are left out: they make SET conditional or change its reply,
-- and the fence would be recorded for a write that did not happen.
local SET_EXPIRY = { EX = true, PX = true, EXAT = true, PXAT = true, KEEPTTL = false }
local SET_USAGE = 'usage: FCALL leasefence_set 2 FENCE KEY TOKEN MODE VALUE [EX s | PX ms | EXAT t | PXAT t | KEEPTTL]'

-- FCALL leasefence_set 2 FENCE KEY TOKEN MODE VALUE [expiry]  -> OK
local function fenced_set(keys, args)
    local n = #args
    if #keys ~= 2 or n < 3 or n > 5 then
        return invalid(SET_USAGE)
    end
    local err = check(keys, args)
    if err then return err end
    if n == 3 then
        return redis.call('MSET', keys[2], args[3], keys[1], args[1])
    end
    local option = string.upper(args[4])
    local takes_number = SET_EXPIRY[option]
    if takes_number == nil or (takes_number and n ~= 5) or (not takes_number and n ~= 4) then
        return invalid(SET_USAGE)
    end
    -- SET refuses a bad expiry itself (the call then aborts before the fence
    -- is written).
    local reply = redis.call('SET', keys[2], args[3], unpack(args, 4))
    redis.call('SET', keys[1], args[1])
    return reply
end

-- FCALL leasefence_del N+1 FENCE KEY... TOKEN MODE  -> number of keys removed
local function fenced_del(keys, args)
    if #keys < 2 or #args ~= 2 then
        return invalid('usage: FCALL leasefence_del N+1 FENCE KEY [KEY...] TOKEN MODE')
    end
    local err = check(keys, args)
    if err then return err end
    local reply = redis.call('DEL', unpack(keys, 2))
    redis.call('SET', keys[1], args[1])
    return reply
end

-- FCALL leasefence_hset 2 FENCE KEY TOKEN MODE FIELD VALUE [FIELD VALUE...]  -> fields added
local function fenced_hset(keys, args)
    if #keys ~= 2 or #args < 4 or #args % 2 ~= 0 then
        return invalid('usage: FCALL leasefence_hset 2 FENCE KEY TOKEN MODE FIELD VALUE [FIELD VALUE...]')
    end
    local err = check(keys, args)
    if err then return err end
    local reply = redis.call('HSET', keys[2], unpack(args, 3))
    redis.call('SET', keys[1], args[1])
    return reply
end

-- FCALL leasefence_xadd 2 FENCE STREAM TOKEN MODE [OPTIONS] ID FIELD VALUE [FIELD VALUE...]
--   -> entry id, or nil (and no fence) when NOMKSTREAM found no stream
-- OPTIONS are XADD's own (NOMKSTREAM, MAXLEN/MINID [=|~] n [LIMIT n]); XADD
-- checks them and the field count.
local function fenced_xadd(keys, args)
    if #keys ~= 2 or #args < 5 then
        return invalid('usage: FCALL leasefence_xadd 2 FENCE STREAM TOKEN MODE [OPTIONS] ID FIELD VALUE [FIELD VALUE...]')
    end
    local err = check(keys, args)
    if err then return err end
    local reply = redis.call('XADD', keys[2], unpack(args, 3))
    if not reply then
        -- NOMKSTREAM and no stream: nothing was written, so no token either.
        return reply
    end
    redis.call('SET', keys[1], args[1])
    return reply
end

-- FCALL_RO leasefence_key_ids 0  -> the ids of the keys loaded, sorted (not the secrets)
local function key_ids()
    local ids = {}
    for id in pairs(FENCE_KEYS) do
        ids[#ids + 1] = id
    end
    table.sort(ids)
    return ids
end

-- FCALL_RO leasefence_hmac 0 KEYHEX MESSAGE  -> the HMAC-SHA256 in hex
-- (for tests of this library's SHA-256 against another implementation).
local function hmac_for_tests(_, args)
    if #args ~= 2 or #args[1] ~= 64 or not string.find(args[1], '^[0-9a-f]+$') then
        return invalid('usage: FCALL_RO leasefence_hmac 0 KEYHEX MESSAGE')
    end
    return hmac_sha256_hex(args[1], args[2])
end

redis.register_function('leasefence_set', fenced_set)
redis.register_function('leasefence_del', fenced_del)
redis.register_function('leasefence_hset', fenced_hset)
redis.register_function('leasefence_xadd', fenced_xadd)
redis.register_function{
    function_name = 'leasefence_version',
    callback = function() return VERSION end,
    flags = { 'no-writes' },
}
redis.register_function{ function_name = 'leasefence_key_ids', callback = key_ids, flags = { 'no-writes' } }
redis.register_function{ function_name = 'leasefence_hmac', callback = hmac_for_tests, flags = { 'no-writes' } }
