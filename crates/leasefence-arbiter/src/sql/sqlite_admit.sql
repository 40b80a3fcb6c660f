-- ?1 resource, ?2 token, ?3 mode. Returns a row only when admitted.
INSERT INTO leasefence_fences AS f (resource, last_token, mode, updated_at)
VALUES (?1, ?2, ?3, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
ON CONFLICT (resource) DO UPDATE
    SET last_token = excluded.last_token, mode = excluded.mode, updated_at = excluded.updated_at
    WHERE f.last_token < excluded.last_token
       OR (excluded.mode = 'monotonic' AND f.last_token = excluded.last_token)
RETURNING last_token
