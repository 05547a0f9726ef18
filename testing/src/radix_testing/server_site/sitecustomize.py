"""Test-only: loads the server shims in every process of a test server (see sglang_server_shims)."""

from radix_testing import sglang_server_shims

sglang_server_shims.install()
