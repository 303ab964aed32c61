#ifndef STITCH_CCRYPTO_SHIM_H
#define STITCH_CCRYPTO_SHIM_H
#include <openssl/evp.h>
#endif
