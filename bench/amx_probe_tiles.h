/* amx_probe_tiles.h -- the tile setup the AMX probes share
 * (amx_tile_probe.c, amx_resume_probe.c): the kernel's permission for the
 * tile state, and palette 1 with 8 tiles of 16 rows x 64 bytes, loaded by
 * an asm operand of all 64 bytes (gcc 12's _tile_loadconfig declares 8
 * read: src_c/simd/bf16_tiles.h). */
#ifndef AMX_PROBE_TILES_H
#define AMX_PROBE_TILES_H

#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct { uint8_t b[64]; } tilecfg;

/* 0 once this thread may use the tiles (Linux: ARCH_REQ_XCOMP_PERM) */
static int tiles_permitted(void)
{
    return (int)syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */);
}

static void tiles_on(void)
{
    tilecfg c;
    memset(&c, 0, sizeof c);
    c.b[0] = 1;
    for (int t = 0; t < 8; t++) {
        c.b[16 + 2 * t] = 64;
        c.b[48 + t] = 16;
    }
    __asm__ volatile("ldtilecfg %0" ::"m"(c));
}

#endif
