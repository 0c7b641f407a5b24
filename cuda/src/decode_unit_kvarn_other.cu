// Decode kernel instances of the table rows whose unit is kvarn_other.
#define KVARN_DECODE_UNIT_kvarn_other
#include "decode_unit.cuh"
