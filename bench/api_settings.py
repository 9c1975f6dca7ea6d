"""bench/api.py's server: the broker's production settings plus the bare baseline view (bench/api_urls.py)."""

from broker.settings import *  # noqa: F403 - the whole production configuration, one setting changed

ROOT_URLCONF = "bench.api_urls"
