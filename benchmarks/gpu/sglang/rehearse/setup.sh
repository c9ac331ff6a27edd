# CPU rehearsal of sglang_h200.sh (no GPU, no SGLang): SGL_SETUP=this file. `python -m sglang.launch_server`
# then runs servefleet's SGLang simulator (sglang/launch_server.py here), servefleet from this checkout.
_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PYTHONPATH=$_here:$(cd "$_here/../../../../src" && pwd) STANDIN_MODULES=""
