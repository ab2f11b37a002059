# Sourced by the one-call GPU scripts (gpu_warm.sh, gpu_profiles.sh, gpu_verify.sh): unbuffered
# output, Ember's packages importable from this checkout and installed editable (no index: the
# GPU machine has no registry). Needs OUT set; the pip log goes to $OUT/install.log.
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD:$PWD/core:$PWD/plugins/inductor:$PWD/plugins/eager:$PWD/plugins/aot_eager:$PWD/plugins/cudagraphs"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e ./core -e ./plugins/eager \
  -e ./plugins/aot_eager -e ./plugins/inductor -e ./plugins/cudagraphs >"$OUT/install.log" 2>&1
