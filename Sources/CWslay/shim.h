#ifndef STITCH_CWSLAY_SHIM_H
#define STITCH_CWSLAY_SHIM_H
#include <wslay/wslay.h>
#endif
