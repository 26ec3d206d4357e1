/* A dynamically linked binary, mounted into the workload container to show that the
 * image's loader and libc work (what an injected driver utility will need). */
#include <stdio.h>
int main(void) { puts("hello-from-dynamic-binary"); return 0; }
