// Decode kernel instances of the table rows whose unit is kvarn_k4.
#define KVARN_DECODE_UNIT_kvarn_k4
#include "decode_unit.cuh"
