// Decode kernel instances of the table rows whose unit is fp.
#define KVARN_DECODE_UNIT_fp
#include "decode_unit.cuh"
