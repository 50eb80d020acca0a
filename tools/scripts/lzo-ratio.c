/* lzo-ratio: per-page compression ratio of a page corpus with LZO1X-1 (and
 * LZ4 for calibration), counted the way zram counts: same-filled pages
 * take no compressed bytes, a page that does not shrink below zram's huge
 * size is stored whole.
 *
 * Why: Debian's 6.12 kernel in the qemu guest builds zram without its LZO
 * backend (comp_algorithm offers lz4 lz4hc zstd deflate), so zram lzo-rle
 * cannot be measured there. LZO1X-1 is the algorithm lzo-rle extends (lzo-rle
 * only adds run-length coding of zero runs), so its ratio is a close, slightly
 * pessimistic stand-in; the LZ4 figure checks the method against zram lz4's
 * compr_data_size measured in the guest on the same pages.
 *
 *   cc -O2 -o /tmp/lzo-ratio tools/scripts/lzo-ratio.c -llzo2 -llz4
 *   zstd -dc ../shared/corpus/realmem-dev.bin.zst > /tmp/realmem-dev.bin
 *   /tmp/lzo-ratio /tmp/realmem-dev.bin
 */
#include <lz4.h>
#include <lzo/lzo1x.h>
#include <stdio.h>
#include <string.h>

#define PAGE 4096
/* zram stores a page whole when it compresses to more than this (zsmalloc's
 * huge class size on x86-64 with 4 KB pages, about 3/4 of a page). */
#define HUGE 3264

static int same_filled(const unsigned char *p)
{
	unsigned long w0, w;
	memcpy(&w0, p, sizeof w0);
	for (size_t i = 0; i < PAGE; i += sizeof w) {
		memcpy(&w, p + i, sizeof w);
		if (w != w0)
			return 0;
	}
	return 1;
}

int main(int argc, char **argv)
{
	static unsigned char page[PAGE], out[PAGE * 2], wrk[LZO1X_1_MEM_COMPRESS];
	unsigned long long pages = 0, same = 0, lzo = 0, lz4 = 0;
	FILE *f;

	if (argc != 2 || !(f = fopen(argv[1], "rb"))) {
		fprintf(stderr, "usage: lzo-ratio CORPUS.bin\n");
		return 2;
	}
	if (lzo_init() != LZO_E_OK)
		return 2;
	while (fread(page, 1, PAGE, f) == PAGE) {
		lzo_uint n = sizeof out;
		int m;

		pages++;
		if (same_filled(page)) {
			same++;
			continue;
		}
		if (lzo1x_1_compress(page, PAGE, out, &n, wrk) != LZO_E_OK)
			return 1;
		lzo += n > HUGE ? PAGE : n;
		m = LZ4_compress_default((const char *)page, (char *)out, PAGE, sizeof out);
		lz4 += (m <= 0 || m > HUGE) ? PAGE : (unsigned long long)m;
	}
	fclose(f);
	printf("{\"pages\":%llu,\"same_pages\":%llu,\"orig\":%llu,\"lzo1x_1_compr\":%llu,"
	       "\"lz4_compr\":%llu,\"lzo1x_1_ratio_data\":%.3f,\"lz4_ratio_data\":%.3f}\n",
	       pages, same, pages * PAGE, lzo, lz4, (double)pages * PAGE / lzo,
	       (double)pages * PAGE / lz4);
	return 0;
}
