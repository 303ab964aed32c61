#ifndef STITCH_SYSTEM_SHIM_H
#define STITCH_SYSTEM_SHIM_H
/* Linux headers Glibc's Swift module does not export. */
#include <sys/xattr.h>
#endif
