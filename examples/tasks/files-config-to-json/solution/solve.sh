#!/usr/bin/env bash
# Reference solution for files-config-to-json (bash + python3 stdlib). Idempotent: running it twice leaves the same result.
set -euo pipefail
cd "${OPENFORGE_WORKSPACE:-/workspace}"
python3 - <<'PY'
import configparser, json
ini = configparser.ConfigParser()
ini.read("config/app.ini")
env = {}
for line in open("config/.env"):
    line = line.strip()
    if not line or line.startswith("#") or "=" not in line:
        continue
    k, v = line.split("=", 1)
    env[k.strip()] = v.strip().strip('"').strip("'")
def get(section, key):
    prefix = {"database": "DB_", "cache": "CACHE_"}.get(section, "")
    return env.get(prefix + key.upper(), ini.get(section, key))
out = {
    "db_host": get("database", "host"),
    "db_port": int(get("database", "port")),
    "db_name": get("database", "name"),
    "workers": int(get("server", "workers")),
    "debug": get("server", "debug").lower() in ("1", "true", "yes", "on"),
    "log_level": get("server", "log_level"),
    "allowed_hosts": [h.strip() for h in get("server", "allowed_hosts").split(",") if h.strip()],
    "cache_ttl_seconds": int(get("cache", "ttl_seconds")),
}
with open("config.json", "w") as fh:
    json.dump(out, fh, indent=2)
    fh.write("\n")
PY
